"""Tensor element types on the wire, numbered as TensorFlow's DataType enum.

Both wire formats use these codes, so a C++ receiver can hand them to
TensorFlow unchanged.
"""

from __future__ import annotations

import numpy as np

from wire.errors import WireError

CODE_TO_DTYPE: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.float64),
    3: np.dtype(np.int32),
    4: np.dtype(np.uint8),
    5: np.dtype(np.int16),
    6: np.dtype(np.int8),
    9: np.dtype(np.int64),
    10: np.dtype(np.bool_),
    17: np.dtype(np.uint16),
    19: np.dtype(np.float16),
    22: np.dtype(np.uint32),
    23: np.dtype(np.uint64),
}
DTYPE_TO_CODE: dict[np.dtype, int] = {v: k for k, v in CODE_TO_DTYPE.items()}

MAX_NDIM = 8


def code_of(dtype: np.dtype | type, field: str = "dtype") -> int:
    """The wire code of a numpy dtype; refuses types the receivers cannot build."""
    dt = np.dtype(dtype)
    # Wire bytes are little-endian/native; a big-endian array would be misread.
    if dt.byteorder == ">":
        raise WireError(field, f"big-endian {dt} is not supported; use {dt.newbyteorder('=')}")
    dt = dt.newbyteorder("=")
    try:
        return DTYPE_TO_CODE[dt]
    except KeyError:
        names = ", ".join(str(d) for d in DTYPE_TO_CODE)
        raise WireError(field, f"{dt} cannot be sent (supported: {names})") from None


def dtype_of(code: int, field: str = "dtype") -> np.dtype:
    """The numpy dtype of a wire code, or a WireError naming the code."""
    try:
        return CODE_TO_DTYPE[code]
    except KeyError:
        raise WireError(field, f"unknown dtype code {code}") from None
