"""A batch of variable-length byte strings (encoded JPEG files, say) as one tensor of the native format.

Images that are decoded where they are trained (on the GPU) travel as their
files' bytes, each a different length. Such a tensor has dtype code 7
(TensorFlow's DT_STRING), one dimension, shape [n], and its frame (or its
place in a shared-memory slot) holds a length table, then the strings back
to back::

    uint64 length[n]        little-endian
    bytes  data[sum(length)]

The receiver checks the table before it reads a string: the frame must hold
the table, and the lengths must add up to exactly the bytes after it
(`tensor[i].lengths` names either fault). In Python the tensor is a numpy
object array of `bytes`. The zmq_ops format has no such type.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from wire.errors import WireError, byte_view

CODE = 7  # TensorFlow's DT_STRING
DTYPE = np.dtype(object)
_TABLE = np.dtype("<u8")


def is_strings(a: object) -> bool:
    """True for a byte-string tensor (a numpy object array)."""
    return isinstance(a, np.ndarray) and a.dtype == DTYPE


def of(items: Iterable[bytes]) -> np.ndarray:
    """A byte-string tensor holding `items` (no copy of the bytes)."""
    items = list(items)
    out = np.empty(len(items), DTYPE)
    out[:] = items
    return out


def _items(a: np.ndarray, index: int) -> list[bytes]:
    if a.ndim != 1:
        raise WireError(f"tensor[{index}].ndim", f"a byte-string tensor has 1 dimension, not {a.ndim}")
    items = list(a)
    for k, b in enumerate(items):
        if not isinstance(b, (bytes, bytearray, memoryview)):
            raise WireError(f"tensor[{index}].data", f"item {k} is {type(b).__name__}, not bytes")
    return items


def nbytes(a: np.ndarray) -> int:
    """Bytes the tensor takes on the wire: its table and its strings (a plain array: its own nbytes)."""
    if not is_strings(a):
        return a.nbytes
    return _TABLE.itemsize * len(a) + sum(len(b) for b in a)


def pack(a: np.ndarray, index: int = 0) -> np.ndarray:
    """The tensor's wire bytes (length table, then the strings) as a flat uint8 array: one copy."""
    items = _items(a, index)
    table = np.array([len(b) for b in items], _TABLE).tobytes()
    return np.frombuffer(b"".join([table, *items]), np.uint8)


def unpack(buf: object, n: int, index: int) -> np.ndarray:
    """The n strings of a received tensor, after checking its length table against the bytes there are."""
    mv = byte_view(buf)
    table = _TABLE.itemsize * n
    if table > len(mv):
        raise WireError(f"tensor[{index}].lengths", f"frame has {len(mv)} bytes, its length table needs {table}")
    lengths = np.frombuffer(mv, _TABLE, n).tolist()
    total = sum(lengths)
    if total != len(mv) - table:
        raise WireError(
            f"tensor[{index}].lengths",
            f"the {n} lengths add up to {total} bytes, the frame holds {len(mv) - table} after its table",
        )
    out = np.empty(n, DTYPE)
    at = table
    for k, length in enumerate(lengths):
        out[k] = bytes(mv[at : at + length])
        at += length
    return out


def extent(buf: object, n: int, index: int, room: int) -> int:
    """Bytes a tensor of n strings takes where `buf` starts (shm:// slots), at most `room`; WireError if more."""
    mv = byte_view(buf)
    table = _TABLE.itemsize * n
    if table > min(room, len(mv)):
        raise WireError(
            f"tensor[{index}].lengths", f"a table of {n} lengths overruns the {room} bytes left in the slot"
        )
    total = table + sum(np.frombuffer(mv, _TABLE, n).tolist())
    if total > room:
        raise WireError(f"tensor[{index}].lengths", f"{total} bytes of table and strings overrun the {room} left")
    return total
