"""The one error type for anything wrong with a message taken off the wire."""

from __future__ import annotations

import numpy as np


class WireError(ValueError):
    """A message that cannot be decoded; `field` names the part that is wrong.

    Receivers catch this one type, so a hostile or broken peer costs one
    rejected message, never a crash deep inside numpy.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def byte_view(buf: object) -> memoryview:
    """A flat unsigned-byte view of any buffer (bytes, zmq frame, numpy array), without a copy."""
    mv = memoryview(buf)
    if mv.nbytes == 0:
        return memoryview(b"")
    if mv.ndim == 1 and mv.format == "B":
        return mv
    return mv.cast("B")


def shaped(flat: np.ndarray, shape: tuple[int, ...], index: int) -> np.ndarray:
    """`flat` reshaped, or a WireError: an empty tensor can claim dimensions no array can have."""
    try:
        return flat.reshape(shape)
    except ValueError:
        raise WireError(f"tensor[{index}].shape", f"{list(shape)} is not a possible array shape") from None
