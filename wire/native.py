"""feedbench's native multipart format (format 2 in docs/wire.md).

Frame 0 is a small fixed header, frames 1..n hold each tensor's raw bytes.
Multipart lets the sender hand numpy buffers to ZMQ without joining them
into one frame, and the sequence number and send time let the receiver count
loss and measure latency. All integers are little-endian.

Header frame::

    offset size  field
    0      4     magic        b"FBWN"
    4      2     version      uint16, currently 1
    6      2     n_tensors    uint16
    8      4     producer_id  uint32
    12     8     seq          uint64, per producer, starts at 0
    20     8     send_time_ns int64, sender's time.time_ns() just before send
    28     4     extras_len   uint32, length of the msgpack map at the end
    32     ...   n_tensors x { int32 dtype; int32 ndim; int64 shape[ndim] }
    ...    extras_len  msgpack map (producer telemetry; may be empty)

A tensor of dtype 7 is a batch of byte strings (wire/strings.py): shape [n],
its frame a length table and the strings.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from wire import strings
from wire.dtypes import MAX_NDIM, code_of, dtype_of
from wire.errors import WireError, byte_view, shaped

MAGIC = b"FBWN"
VERSION = 1
MAX_TENSORS = 1024
MAX_EXTRAS = 64 * 1024

_FIXED = struct.Struct("<4sHHIQqI")
_DESC = struct.Struct("<ii")


@dataclass(frozen=True)
class Header:
    """What frame 0 says about the batch behind it."""

    producer_id: int
    seq: int
    send_time_ns: int
    dtypes: tuple[np.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]
    extras: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION


def encode_header(
    arrays: Sequence[np.ndarray],
    producer_id: int,
    seq: int,
    send_time_ns: int | None = None,
    extras: dict[str, Any] | None = None,
) -> bytes:
    """Frame 0 for `arrays`; the arrays themselves go out as frames 1..n."""
    if len(arrays) > MAX_TENSORS:
        raise WireError("n_tensors", f"{len(arrays)} > {MAX_TENSORS}")
    extra_bytes = msgpack.packb(extras, use_bin_type=True) if extras else b""
    if len(extra_bytes) > MAX_EXTRAS:
        raise WireError("extras_len", f"{len(extra_bytes)} > {MAX_EXTRAS}")
    t = time.time_ns() if send_time_ns is None else send_time_ns
    parts = [_FIXED.pack(MAGIC, VERSION, len(arrays), producer_id, seq, t, len(extra_bytes))]
    for i, arr in enumerate(arrays):
        if arr.ndim > MAX_NDIM:
            raise WireError(f"tensor[{i}].ndim", f"{arr.ndim} > {MAX_NDIM}")
        if strings.is_strings(arr) and arr.ndim != 1:
            raise WireError(f"tensor[{i}].ndim", f"a byte-string tensor has 1 dimension, not {arr.ndim}")
        code = strings.CODE if strings.is_strings(arr) else code_of(arr.dtype, f"tensor[{i}].dtype")
        parts.append(_DESC.pack(code, arr.ndim))
        parts.append(struct.pack(f"<{arr.ndim}q", *arr.shape))
    parts.append(extra_bytes)
    return b"".join(parts)


def encode(
    arrays: Sequence[np.ndarray],
    producer_id: int,
    seq: int,
    send_time_ns: int | None = None,
    extras: dict[str, Any] | None = None,
) -> list[bytes | np.ndarray]:
    """All frames of one message; tensor frames are the arrays, not copies."""
    arrays = [np.require(a, requirements="C") for a in arrays]  # keeps 0-d arrays 0-d
    head = encode_header(arrays, producer_id, seq, send_time_ns, extras)
    return [head, *(strings.pack(a, i) if strings.is_strings(a) else a for i, a in enumerate(arrays))]


def decode_header(buf: bytes | memoryview) -> Header:
    """Parse frame 0, checking every field before anything is allocated."""
    mv = byte_view(buf)
    size = len(mv)
    if size < _FIXED.size:
        raise WireError("header", f"{size} bytes, shorter than the {_FIXED.size}-byte fixed part")
    magic, version, n, producer_id, seq, t, extras_len = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise WireError("magic", f"{bytes(magic)!r} is not {MAGIC!r}")
    if version != VERSION:
        raise WireError("version", f"unknown header version {version} (this build reads {VERSION})")
    if n > MAX_TENSORS:
        raise WireError("n_tensors", f"{n} > {MAX_TENSORS}")
    off = _FIXED.size
    dtypes, shapes = [], []
    for i in range(n):
        if off + _DESC.size > size:
            raise WireError(f"tensor[{i}].dtype", f"header truncated at byte {off} of {size}")
        code, ndim = _DESC.unpack_from(mv, off)
        off += _DESC.size
        dtypes.append(strings.DTYPE if code == strings.CODE else dtype_of(code, f"tensor[{i}].dtype"))
        if ndim < 0 or ndim > MAX_NDIM:
            raise WireError(f"tensor[{i}].ndim", f"{ndim} is outside 0..{MAX_NDIM}")
        if code == strings.CODE and ndim != 1:
            raise WireError(f"tensor[{i}].ndim", f"a byte-string tensor has 1 dimension, not {ndim}")
        if off + 8 * ndim > size:
            raise WireError(f"tensor[{i}].shape", f"header truncated at byte {off} of {size}")
        shape = struct.unpack_from(f"<{ndim}q", mv, off)
        off += 8 * ndim
        for j, d in enumerate(shape):
            if d < 0:
                raise WireError(f"tensor[{i}].shape[{j}]", f"negative dimension {d}")
        shapes.append(tuple(shape))
    if off + extras_len != size:
        raise WireError("extras_len", f"{extras_len} does not match the {size - off} bytes left in the header")
    extras: dict[str, Any] = {}
    if extras_len:
        try:
            extras = msgpack.unpackb(mv[off:], raw=False, strict_map_key=True)
        except Exception as e:  # msgpack raises several types for bad input
            raise WireError("extras", f"not a valid msgpack map ({e})") from None
        if not isinstance(extras, dict):
            raise WireError("extras", f"expected a msgpack map, got {type(extras).__name__}")
    return Header(producer_id, seq, t, tuple(dtypes), tuple(shapes), extras, version)


def decode(frames: Sequence[bytes | memoryview]) -> tuple[Header, list[np.ndarray]]:
    """Parse a whole message into its header and read-only arrays viewing the frames (byte strings: copies)."""
    if not frames:
        raise WireError("frames", "empty message")
    header = decode_header(frames[0])
    n = len(header.dtypes)
    if len(frames) != n + 1:
        raise WireError("frames", f"header declares {n} tensors but {len(frames) - 1} data frames arrived")
    arrays = []
    for i, (dtype, shape, frame) in enumerate(zip(header.dtypes, header.shapes, frames[1:])):
        mv = byte_view(frame)
        if dtype == strings.DTYPE:
            arrays.append(strings.unpack(mv, shape[0], i))
            continue
        count = math.prod(shape)
        expected = count * dtype.itemsize
        if len(mv) != expected:
            raise WireError(
                f"tensor[{i}].nbytes",
                f"frame has {len(mv)} bytes, shape {list(shape)} x {dtype.itemsize}-byte {dtype} needs {expected}",
            )
        arrays.append(shaped(np.frombuffer(mv, dtype=dtype, count=count), shape, i))
    return header, arrays
