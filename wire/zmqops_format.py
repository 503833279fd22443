"""The single-frame format of tensorpack/zmq_ops (format 1 in docs/wire.md).

Layout, native byte order, no padding::

    int32 n
    n x { int32 dtype; int32 ndim; int32 shape[ndim]; int64 nbytes; bytes data[nbytes] }

`dump_arrays` gives byte-for-byte what tensorpack's zmq_ops gives, so its
senders and receivers interoperate with ours.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np

from wire.dtypes import MAX_NDIM, code_of, dtype_of
from wire.errors import WireError, byte_view, shaped

MAX_TENSORS = 1024

_I32 = struct.Struct("=i")
_I64 = struct.Struct("=q")


def _as_array(x: object, index: int) -> np.ndarray:
    # tensorpack's dump_arrays accepts bare Python numbers; keep that.
    if isinstance(x, bool):
        return np.asarray(x, dtype=np.bool_)
    if isinstance(x, float):
        return np.asarray(x, dtype=np.float32)
    if isinstance(x, int):
        return np.asarray(x, dtype=np.int32)
    if not isinstance(x, np.ndarray):
        raise WireError(f"tensor[{index}]", f"expected a numpy array, got {type(x).__name__}")
    return np.require(x, requirements="C")  # unlike ascontiguousarray, keeps 0-d arrays 0-d


def dump_arrays(arrays: Sequence[np.ndarray]) -> bytes:
    """Serialise arrays into one zmq_ops frame (one copy of the data)."""
    if not isinstance(arrays, (list, tuple)):
        raise WireError("arrays", f"expected a list or tuple, got {type(arrays).__name__}")
    parts: list[bytes | memoryview] = [_I32.pack(len(arrays))]
    for i, x in enumerate(arrays):
        arr = _as_array(x, i)
        if arr.ndim > MAX_NDIM:
            raise WireError(f"tensor[{i}].ndim", f"{arr.ndim} > {MAX_NDIM}")
        code = code_of(arr.dtype, f"tensor[{i}].dtype")
        parts.append(struct.pack(f"=ii{arr.ndim}i", code, arr.ndim, *arr.shape))
        parts.append(_I64.pack(arr.nbytes))
        parts.append(memoryview(arr).cast("B") if arr.nbytes else b"")
    return b"".join(parts)


def load_arrays(buf: bytes | memoryview, max_tensors: int = MAX_TENSORS) -> list[np.ndarray]:
    """Parse one zmq_ops frame into read-only arrays that view `buf` (no copy)."""
    mv = byte_view(buf)
    size = len(mv)
    if size < 4:
        raise WireError("n_tensors", f"message is {size} bytes, too short for the tensor count")
    (n,) = _I32.unpack_from(mv, 0)
    if n < 0 or n > max_tensors:
        raise WireError("n_tensors", f"{n} is outside 0..{max_tensors}")
    off = 4
    out: list[np.ndarray] = []
    for i in range(n):
        if off + 8 > size:
            raise WireError(f"tensor[{i}].dtype", f"truncated at byte {off} of {size}")
        code, ndim = struct.unpack_from("=ii", mv, off)
        off += 8
        dtype = dtype_of(code, f"tensor[{i}].dtype")
        if ndim < 0 or ndim > MAX_NDIM:
            raise WireError(f"tensor[{i}].ndim", f"{ndim} is outside 0..{MAX_NDIM}")
        if off + 4 * ndim + 8 > size:
            raise WireError(f"tensor[{i}].shape", f"truncated at byte {off} of {size}")
        shape = struct.unpack_from(f"={ndim}i", mv, off)
        off += 4 * ndim
        for j, d in enumerate(shape):
            if d < 0:
                raise WireError(f"tensor[{i}].shape[{j}]", f"negative dimension {d}")
        (nbytes,) = _I64.unpack_from(mv, off)
        off += 8
        count = math.prod(shape)  # Python int: cannot overflow
        expected = count * dtype.itemsize
        if nbytes != expected:
            raise WireError(
                f"tensor[{i}].nbytes",
                f"{nbytes} does not match shape {list(shape)} x {dtype.itemsize}-byte {dtype} = {expected}",
            )
        if off + nbytes > size:
            raise WireError(f"tensor[{i}].data", f"needs {nbytes} bytes, only {size - off} left")
        out.append(shaped(np.frombuffer(mv, dtype=dtype, count=count, offset=off), shape, i))
        off += nbytes
    if off != size:
        raise WireError("message", f"{size - off} trailing bytes after {n} tensors")
    return out
