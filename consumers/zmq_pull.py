"""Pull batches from producers in Python, in either wire format.

This is what the python-queue and python-dataset input paths read from, and
what the wire benchmark measures. Arrays view ZMQ's receive buffers, so a
batch costs no copy until the caller makes one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import zmq

from consumers.accounting import SeqTracker
from wire import curve, message
from wire.endpoints import attach


class ReceiveTimeout(TimeoutError):
    """No batch arrived in time; the message names the endpoint."""


class PullConsumer:
    """A PULL socket that yields decoded batches and keeps exact per-producer counts.

    Binds by default (producers connect to it), so several producers can fan
    in and a restarted producer is picked up again. `max_msg_size` caps what
    a peer can make us allocate (ZMQ_MAXMSGSIZE); oversize peers are dropped.
    """

    def __init__(
        self,
        endpoint: str,
        bind: bool = True,
        hwm: int = 4,
        recv_timeout: float | None = None,
        max_msg_size: int | None = None,
        allow_remote: bool = False,
        curve_keys: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.recv_timeout = recv_timeout
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if max_msg_size:
            self._sock.setsockopt(zmq.MAXMSGSIZE, max_msg_size)
        self._auth = None
        try:
            if curve_keys:
                self._auth = curve.secure(self._sock, curve_keys, server=bind)
            attach(self._sock, endpoint, bind, allow_remote, secured=bool(curve_keys))
        except BaseException:
            self.close()
            raise
        self.tracker = SeqTracker()
        self.batches = 0
        self.bytes = 0
        self.wait_s = 0.0  # time spent blocked in recv: the input-wait of whoever calls us
        self.latency_s = 0.0  # sum of end-to-end latencies from the native send timestamp

    def recv(self) -> message.Batch:
        """The next batch; ReceiveTimeout if none arrives within `recv_timeout`."""
        t0 = time.perf_counter()
        timeout_ms = -1 if self.recv_timeout is None else int(self.recv_timeout * 1000)
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            raise ReceiveTimeout(f"no batch from {self.endpoint} within {self.recv_timeout:g} s")
        batch = message.recv(self._sock)
        self.wait_s += time.perf_counter() - t0
        self.batches += 1
        self.bytes += batch.nbytes
        if batch.header is not None:
            h = batch.header
            self.tracker.add(h.producer_id, h.seq, h.extras)
            self.latency_s += max(0.0, time.time_ns() - h.send_time_ns) / 1e9
        return batch

    def arrays(self) -> Iterator[list[np.ndarray]]:
        """Yield the arrays of each batch, forever (or until a timeout)."""
        while True:
            yield self.recv().arrays

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        return self.arrays()

    def close(self) -> None:
        self._sock.close(0)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
