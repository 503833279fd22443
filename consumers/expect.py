"""What every batch of a run must look like, and the one line that says how a batch differs.

A producer (the run's own, or an external one on --endpoint) can send images
of another size, another dtype, another batch size or another number of
tensors. Caught here, at the consumer, such a batch stops the run at once
with a line that names the endpoint, the producer when its header says which,
and both layouts, instead of failing later deep inside the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# What to do about a batch of another shape: the producer was started with other flags than the run.
SAME_FLAGS = "give the producer and the run the same --batch and --image-size"
# Receivers accept messages up to this size even when the run expects smaller ones, so that a
# producer of larger batches gets a one-line mismatch error instead of a connection ZMQ drops
# without a word (ZMQ_MAXMSGSIZE); --max-msg-size sets another cap.
MIN_RECEIVE_CAP = 1 << 30


def receive_cap(batch: int, image_size: int) -> int:
    """The default receive cap (bytes per frame): the expected batch with a margin, and at least 1 GiB."""
    return max(MIN_RECEIVE_CAP, int((batch * image_size * image_size * 3 + batch * 4) * 1.25) + 64 * 1024)


class BatchMismatch(ValueError):
    """A well-formed batch that is not what the run expects; the message names the producer and both layouts."""


def describe(tensors: Sequence[tuple[str, Sequence[int]]]) -> str:
    """`uint8 [64,224,224,3], int32 [64]`: dtypes and shapes as a user reads them."""
    return ", ".join(f"{dtype} [{','.join(str(d) for d in shape)}]" for dtype, shape in tensors)


@dataclass(frozen=True)
class BatchSpec:
    """One (dtype name, shape) per tensor of a batch, in order."""

    tensors: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def images(cls, batch: int, image_size: int) -> BatchSpec:
        """The batches every input path carries: uint8 NHWC images and int32 labels."""
        return cls((("uint8", (batch, image_size, image_size, 3)), ("int32", (batch,))))

    @classmethod
    def from_signature(cls, specs: Sequence, batch: int) -> BatchSpec:
        """From a model's input signature (TensorSpec-like: .dtype.name, .shape), its batch dimension filled in."""
        return cls(
            tuple((s.dtype.name, tuple(batch if d is None else int(d) for d in s.shape.as_list())) for s in specs)
        )

    def __str__(self) -> str:
        return describe(self.tensors)

    def mismatch(self, arrays: Sequence[np.ndarray]) -> str | None:
        """None when `arrays` are what the run expects, else "is <got>; the run expects <wanted>[; which flags]"."""
        got = tuple((a.dtype.name, tuple(a.shape)) for a in arrays)
        if got == self.tensors:
            return None
        same_kinds = [d for d, _ in got] == [d for d, _ in self.tensors]
        return f"is {describe(got)}; the run expects {self}" + (f"; {SAME_FLAGS}" if same_kinds else "")
