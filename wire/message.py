"""Send and receive one batch over a pyzmq socket, in either wire format.

Receivers tell the formats apart by the native header's magic, so one
consumer takes messages from both kinds of producer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from wire import native
from wire.errors import WireError, byte_view
from wire.zmqops_format import dump_arrays, load_arrays

FORMATS = ("native", "zmq_ops")


@dataclass
class Batch:
    """One received message: its arrays (views of the frames) and what came with them."""

    arrays: list[np.ndarray]
    nbytes: int
    header: native.Header | None = None  # the zmq_ops format carries no header


def send(
    sock: zmq.Socket,
    arrays: Sequence[np.ndarray],
    fmt: str = "native",
    producer_id: int = 0,
    seq: int = 0,
    extras: dict[str, Any] | None = None,
    flags: int = 0,
) -> int:
    """Send one batch; returns the bytes put on the wire.

    Native frames are handed to ZMQ without a copy (pyzmq still copies
    frames under its copy threshold, where that is cheaper), so callers must
    not modify the arrays after sending them.
    """
    if fmt == "native":
        frames = native.encode(arrays, producer_id, seq, extras=extras)
        sock.send_multipart(frames, flags=flags, copy=False)
        return sum(len(frames[0]) if i == 0 else frames[i].nbytes for i in range(len(frames)))
    if fmt == "zmq_ops":
        buf = dump_arrays(list(arrays))
        sock.send(buf, flags=flags, copy=False)
        return len(buf)
    raise ValueError(f"unknown wire format {fmt!r} (choose from {', '.join(FORMATS)})")


def decode_message(frames: Sequence[bytes | memoryview]) -> Batch:
    """Decode a received message of either format."""
    if not frames:
        raise WireError("frames", "empty message")
    nbytes = sum(len(byte_view(f)) for f in frames)
    first = byte_view(frames[0])
    if len(frames) > 1 or bytes(first[:4]) == native.MAGIC:
        header, arrays = native.decode(frames)
        return Batch(arrays, nbytes, header)
    return Batch(load_arrays(first), nbytes, None)


def recv(sock: zmq.Socket, flags: int = 0) -> Batch:
    """Receive and decode one message; arrays view ZMQ's buffers without a copy."""
    frames = sock.recv_multipart(flags=flags, copy=False)
    return decode_message([f.buffer for f in frames])
