"""Synthetic batches: a pre-generated pool of random images, cycled.

Generating 9.6 MB of random pixels per batch would cost more than sending it,
so each worker makes a small pool once and sends it round and round. The
pool's arrays are never written again, which is what makes zero-copy sends safe.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SyntheticSource:
    """Batches of uint8 NHWC images and int32 labels; picklable, built in each worker."""

    batch: int = 64
    image_size: int = 224
    classes: int = 1000
    pool: int = 4
    seed: int = 0
    cpu_ms: float = 0.0  # CPU time spent per batch, as decoding and augmenting would (0: none)

    def __call__(self, worker: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.default_rng([self.seed, worker])
        shape = (self.batch, self.image_size, self.image_size, 3)
        images = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(self.pool)]
        labels = [rng.integers(0, self.classes, (self.batch,), dtype=np.int32) for _ in range(self.pool)]
        for a in images + labels:
            a.flags.writeable = False
        for i in itertools.count():
            if self.cpu_ms > 0:
                _burn(self.cpu_ms / 1e3)
            yield images[i % self.pool], labels[i % self.pool]

    def describe(self) -> str:
        burn = f", {self.cpu_ms:g} ms CPU per batch" if self.cpu_ms else ""
        return f"synthetic {self.batch}x{self.image_size}x{self.image_size}x3 uint8{burn}"


def _burn(seconds: float) -> None:
    """Use `seconds` of this process's CPU time (not wall time: a busy machine takes longer)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
