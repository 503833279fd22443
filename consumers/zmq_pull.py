"""Pull batches from producers in Python, in either wire format.

This is what the python-queue and python-dataset input paths read from, and
what the wire benchmark measures. Arrays view ZMQ's receive buffers, so a
batch costs no copy until the caller makes one; from shm:// producers they are
the one copy out of the producer's shared-memory slot (wire/shm.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import numpy as np
import zmq
from zmq.utils import monitor

from consumers.accounting import SeqTracker
from core.errors import ConfigError
from wire import curve, message, shm
from wire.endpoints import EndpointError, attach, release, wait_released

IO_THREADS_ENV = "FEEDBENCH_ZMQ_IO_THREADS"
MAX_IO_THREADS = 64  # each I/O thread reads about 2 GB/s: 64 read more than any machine's network or memcpy


def io_threads(cores: int | None = None) -> int:
    """ZMQ I/O threads for a consumer's context: one per 4 cores (default: those this process may use), 1 to 4.

    One I/O thread reads about 2 GB/s of large messages, under what eight producers send on a 16-core
    machine; each producer's connection is served by one of them, so several read several producers at
    once. FEEDBENCH_ZMQ_IO_THREADS overrides: unset or empty gives the default; else ASCII decimal digits
    only (no sign, space or other script's digits), 1 to MAX_IO_THREADS, or a ConfigError naming the value.
    The native receiver parses it by the same rule (zmq_core.cc:IoThreads).
    """
    given = os.environ.get(IO_THREADS_ENV, "")
    if given:
        digits = len(given) <= 9 and all("0" <= c <= "9" for c in given)
        if not digits or not 1 <= int(given) <= MAX_IO_THREADS:
            text = os.fsencode(given)[:40].decode("utf-8", "replace")  # as zmq_core.cc shows it: its first 40 bytes
            shown = "".join(c if c >= " " and c != "\x7f" else "?" for c in text)
            raise ConfigError(
                f"{IO_THREADS_ENV}='{shown}' is not a whole number from 1 to {MAX_IO_THREADS} "
                "(ZMQ I/O threads per consumer; unset, one per 4 cores)"
            )
        return int(given)
    return min(4, max(1, (cores or len(os.sched_getaffinity(0))) // 4))


class ReceiveTimeout(TimeoutError):
    """No batch arrived in time; the message names the endpoint."""


class ReceiveStopped(RuntimeError):
    """The caller's stop condition came true while waiting for a batch."""


_STOP_SLICE_MS = 100
_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


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
        self._ctx = zmq.Context.instance(io_threads=io_threads())
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if max_msg_size:
            self._sock.setsockopt(zmq.MAXMSGSIZE, max_msg_size)
        self._auth = None
        self._monitor: zmq.Socket | None = None  # refused CURVE handshakes, so a timeout can say why
        self._refused = 0
        self._refused_why = ""
        self._bound = False  # only a socket file this consumer created is removed on close
        try:
            if shm.is_shm(endpoint):
                # Listen for producers' regions before they can reach us; admit only this user's processes.
                self._slots = shm.SlotReader(endpoint)
                shm.restrict_to_user(self._sock)
            else:
                self._slots = shm.SlotReader()
            if curve_keys:
                self._auth = curve.secure(self._sock, curve_keys, server=bind)
                self._monitor = self._sock.get_monitor_socket(_REFUSED)
            attach(self._sock, endpoint, bind, allow_remote, secured=bool(curve_keys))
            self._bound = bind
        except shm.ShmError as e:
            self.close()
            raise EndpointError(str(e)) from None
        except BaseException:
            self.close()
            raise
        self.tracker = SeqTracker()
        self.batches = 0
        self.bytes = 0
        self.wait_s = 0.0  # time spent blocked in recv: the input-wait of whoever calls us
        self.latency_s = 0.0  # sum of end-to-end latencies from the native send timestamp

    def recv(self, stop: Callable[[], bool] | None = None) -> message.Batch:
        """The next batch; ReceiveTimeout if none arrives within `recv_timeout`.

        With `stop`, waits in short slices and raises ReceiveStopped once
        `stop()` is true, so another thread can close the consumer safely.
        """
        t0 = time.perf_counter()
        deadline = None if self.recv_timeout is None else t0 + self.recv_timeout
        while True:
            frames = self._next_frames(stop, deadline)
            if shm.is_slot_message(frames):  # the batch is in a producer's slot: copy it out, free the slot
                header, ref = shm.decode(frames)
                if self._slots.retired(ref.region):  # its producer has exited or moved on: nothing to read
                    continue
                arrays = self._slots.read(header, ref)
                batch = message.Batch(arrays, sum(a.nbytes for a in arrays), header)
            else:
                batch = message.decode_message(frames)
            break
        self.wait_s += time.perf_counter() - t0
        self.batches += 1
        self.bytes += batch.nbytes
        if batch.header is not None:
            h = batch.header
            self.tracker.add(h.producer_id, h.seq, h.extras)
            self.latency_s += max(0.0, time.time_ns() - h.send_time_ns) / 1e9
        return batch

    def counters(self) -> dict:
        """A snapshot of what came in so far, as profiler.telemetry.wire_figures takes two of them."""
        return {
            "time": time.perf_counter(),
            "messages": self.batches,
            "bytes": self.bytes,
            "latency_s": self.latency_s,
            "wait_s": self.wait_s,
            "received": {pid: pc.received for pid, pc in self.tracker.producers.items()},
            "source": "consumer counters",
        }

    def refusals(self) -> str:
        """`N connection attempt(s) refused by CURVE authentication; last: ...`, or "" (as the zmq_ops op says it)."""
        while self._monitor is not None and self._monitor.poll(0, zmq.POLLIN):
            event = monitor.recv_monitor_message(self._monitor)["event"]
            self._refused += 1
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._refused_why = "a producer's client key was refused"
            else:
                self._refused_why = "a producer failed the CURVE handshake (no keys, or another server key)"
        if not self._refused:
            return ""
        return f"{self._refused} connection attempt(s) refused by CURVE authentication; last: {self._refused_why}"

    def _next_frames(self, stop: Callable[[], bool] | None, deadline: float | None) -> list:
        """The frames of the next message, waiting until `deadline` (perf_counter; None: forever)."""
        if stop is None:
            timeout_ms = -1 if deadline is None else max(0, int((deadline - time.perf_counter()) * 1000))
            ready = self._sock.poll(timeout_ms, zmq.POLLIN)
        else:
            while not (ready := self._sock.poll(_STOP_SLICE_MS, zmq.POLLIN)):
                if stop():
                    raise ReceiveStopped(f"receiving from {self.endpoint} was stopped")
                if deadline is not None and time.perf_counter() >= deadline:
                    break
        if not ready:
            refused = self.refusals()
            raise ReceiveTimeout(
                f"no batch from {self.endpoint} within {self.recv_timeout:g} s" + (f"; {refused}" if refused else "")
            )
        return [f.buffer for f in self._sock.recv_multipart(copy=False)]

    def arrays(self) -> Iterator[list[np.ndarray]]:
        """Yield the arrays of each batch, forever (or until a timeout)."""
        while True:
            yield self.recv().arrays

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        return self.arrays()

    def close(self) -> None:
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._monitor = None
        self._sock.close(0)
        if hasattr(self, "_slots"):
            self._slots.close()
        if self._bound:  # libzmq leaves a bound ipc socket's file behind
            release(self.endpoint, bind=True)
            wait_released(self.endpoint)  # the next path binds the same address at once
            self._bound = False
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
