"""The send loop of one producer worker: take batches from a source, push them.

Send latency (how long a send waits for room under the high-water mark) is
the producer's view of the consumer: when it is high, the consumer, not the
producer, is the bottleneck. It is counted here and carried to the consumer
inside each native header, so the run can name the slow stage.
"""

from __future__ import annotations

import fcntl
import math
import struct
import sys
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from wire import curve, message, shm, strings
from wire.endpoints import EndpointError, attach, release

Source = Callable[[int], Iterator[tuple[np.ndarray, ...]]]

# Exit codes of a worker (and of the producer process as a whole).
DONE, FAILED, BAD_ENDPOINT, CONSUMER_GONE = 0, 1, 2, 3
SLOTS_HELD = 4  # shm://: the consumer is there but gave no slot back in time (it exits as CONSUMER_GONE)


@dataclass(frozen=True)
class SendConfig:
    """How a worker sends: where, in which format, how fast, how many."""

    endpoint: str
    fmt: str = "native"
    hwm: int = 4
    bind: bool = False
    count: int | None = None  # batches this worker sends; None = until stopped
    rate: float | None = None  # images/s cap for this worker (to emulate a slow loader)
    producer_id: int = 0
    # Once a consumer has taken a batch, a send blocked this long means it is gone (0: never give up).
    # Before the first consumer arrives a producer waits as long as it is left running.
    give_up_after: float = 60.0
    allow_remote: bool = False
    curve_keys: str | None = None  # key folder: encrypt and authenticate the stream (wire/curve.py)
    busy_wait: bool = False  # spin while the consumer has no room, as a polling loader does (uses a core)
    shm_slots: int | None = None  # shm://: slots per region; None = hwm + HELD_SLOTS
    # shm://: skip rewriting a slot that already holds the same read-only arrays (a synthetic pool).
    # Off by default: every batch is written anew, as a decoding producer must (honest figures).
    reuse_unchanged_slots: bool = False
    # shm://: bytes each slot holds at least (a source whose batches vary in size: its largest); None = the first's
    shm_slot_bytes: int | None = None


# shm://: slots beyond the hwm, for batches a zero-copy consumer holds while it uses them in place
# (tf.data prefetch, StagingArea, a torch prefetcher) without starving its producers.
HELD_SLOTS = 8


class Counters:
    """Per-worker running totals in shared memory, read by the launcher for its progress line."""

    FIELDS = ("batches", "images", "bytes", "send_wait_s", "make_s")

    def __init__(self, shared, worker: int) -> None:
        self._a = shared
        self._base = worker * len(self.FIELDS)

    def add(self, images: int, nbytes: int, send_wait_s: float, make_s: float) -> None:
        a, b = self._a, self._base
        a[b] += 1
        a[b + 1] += images
        a[b + 2] += nbytes
        a[b + 3] += send_wait_s
        a[b + 4] += make_s

    @classmethod
    def totals(cls, shared) -> dict[str, float]:
        n = len(cls.FIELDS)
        return {f: sum(shared[i] for i in range(k, len(shared), n)) for k, f in enumerate(cls.FIELDS)}


class _Telemetry:
    """Rates over the last second or so, sent in each native header's extras."""

    def __init__(self) -> None:
        self._reset(time.perf_counter())
        self.summary: dict[str, float] = {}

    def _reset(self, now: float) -> None:
        self.window_start, self.images, self.make_s, self.send_s, self.sends = now, 0, 0.0, 0.0, 0

    def record(self, images: int, make_s: float, send_s: float) -> None:
        self.images += images
        self.make_s += make_s
        self.send_s += send_s
        self.sends += 1
        now = time.perf_counter()
        if now - self.window_start >= 1.0 or not self.summary:
            span = max(now - self.window_start, 1e-9)
            self.summary = {
                "images_per_sec": self.images / span,
                "make_images_per_sec": self.images / self.make_s if self.make_s > 0 else 0.0,
                "send_latency_ms": 1e3 * self.send_s / self.sends,
            }
            self._reset(now)


MAX_LINGER_MS = 2**31 - 1  # ZMQ_LINGER is a C int


def _linger_ms(give_up_after: float | None) -> int:
    """How long closing waits for queued batches to reach the consumer: --give-up-after, as ZMQ can hold it."""
    return min(int(give_up_after * 1000), MAX_LINGER_MS) if give_up_after else -1


def _pace(until: float, should_stop: Callable[[], bool]) -> None:
    """Sleep until `until` (perf_counter; may be inf for an absurdly low --rate), waking to see should_stop()."""
    while not should_stop():
        left = until - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))


def _deadline(give_up_after: float | None) -> float:
    """The monotonic time to give up at; infinity for None (no consumer yet) or 0 (never)."""
    return time.monotonic() + give_up_after if give_up_after else math.inf


def _wait_writable(
    sock: zmq.Socket, should_stop: Callable[[], bool], give_up_after: float | None, busy: bool = False
) -> bool:
    """Block until the socket takes a message; False if stopped or the consumer is gone.

    `give_up_after` None (or 0) waits as long as we are not stopped: a producer
    started before its consumer waits for it. `busy` spins (poll without
    waiting) instead of sleeping in poll: a loader that busy-waits.
    """
    deadline = _deadline(give_up_after)
    while not sock.poll(0 if busy else 100, zmq.POLLOUT):
        if should_stop() or time.monotonic() > deadline:
            return False
    return True


class _Peers:
    """The consumers connected to the send socket, from its monitor (every connect and disconnect since it was made)."""

    def __init__(self, monitor: zmq.Socket) -> None:
        self.monitor = monitor
        self.count = 0  # consumers connected now
        self.left = 0  # disconnects so far
        self.fds: set[int] = set()  # the connections' sockets (a monitor event's value)

    def update(self) -> _Peers:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["event"] in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.count += 1
                self.fds.add(int(event["value"]))
            else:
                self.count -= 1
                self.left += 1
                self.fds.discard(int(event["value"]))
        return self

    def unread(self) -> int:
        """Bytes sent on the connections that their consumers have not read yet (SIOCOUTQ)."""
        total = 0
        for fd in self.fds:
            try:
                total += struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0]
            except OSError:  # closed since its last event: nothing left to read there
                continue
        return total


def _wait_for_delivery(peers: _Peers, cfg: SendConfig, should_stop: Callable[[], bool]) -> None:
    """After the last batch, stay until the consumers have read every byte sent (or left, or we are stopped).

    libzmq's receiving side drops the bytes still queued in the kernel when
    the sender hangs up while the receiver is at its high-water mark (its
    I/O thread has stopped reading, and the hang-up ends the connection):
    over ipc:// a producer that exits right after its last send loses the
    tail of its stream. So a producer leaves only once its connections'
    send queues are empty. shm:// waits for the consumer to leave: a slot
    message of a producer that has gone is dropped (its region is retired).
    `--give-up-after` bounds a wait with no progress; what was not delivered
    then is named on stderr.
    """
    deadline = _deadline(cfg.give_up_after)
    unread = last = -1
    while not should_stop() and time.monotonic() < deadline:
        if peers.update().count <= 0:
            return
        if not shm.is_shm(cfg.endpoint):
            unread = peers.unread()
            if unread == 0:
                return
            if unread != last:  # the consumer is reading: give it another --give-up-after
                deadline, last = _deadline(cfg.give_up_after), unread
        peers.monitor.poll(20)
    if unread > 0 and not should_stop():
        print(
            f"producer {cfg.producer_id}: {cfg.endpoint}: the consumer read nothing for {cfg.give_up_after:g} s "
            f"(--give-up-after); {unread} bytes of the last batches sent were not delivered",
            file=sys.stderr,
            flush=True,
        )


def _patience(cfg: SendConfig, seq: int) -> float | None:
    """How long a blocked send may wait: for ever until a consumer has taken the first batch."""
    return cfg.give_up_after if seq > 0 else None


STALE = -1  # _send: the slot message names a region the next consumer cannot read; prepare the batch again


def _send(
    sock: zmq.Socket,
    arrays,
    cfg: SendConfig,
    seq: int,
    extras: dict | None,
    should_stop,
    frames=None,
    stale: Callable[[], bool] = lambda: False,
    ready: Callable[[], bool] = lambda: True,
) -> int | None:
    """Send one batch (or, for shm://, its slot message `frames`) once there is room.

    Returns the batch's bytes, None when stopped or the consumer is gone, or
    STALE when `stale()` says the consumer the slot message was made for has
    left while we waited (the next one could not map its region). `ready()`
    is asked once the socket has room; False waits and asks again.
    """
    while True:
        if not _wait_writable(sock, lambda: should_stop() or stale(), _patience(cfg, seq), cfg.busy_wait):
            return STALE if stale() and not should_stop() else None
        if stale():  # a new consumer is there, but the slot message was made for the one that left
            return STALE
        if not ready():  # shm://: the consumer has not taken our region yet (it may be leaving)
            if should_stop():
                return None
            continue
        try:
            if frames is not None:
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
                return sum(strings.nbytes(a) for a in arrays)
            return message.send(sock, arrays, cfg.fmt, cfg.producer_id, seq, extras, flags=zmq.NOBLOCK)
        except zmq.Again:  # the consumer hung up between the poll and the send: wait again
            continue


class _SlotSender:
    """The shm:// half of a send: the batch goes into a free slot of our region, then its slot message is sent.

    A source that can fill buffers it is given (`fills_buffers = True`, e.g.
    the JPEG decoder) is handed views into the next free slot, so it decodes
    straight into shared memory and nothing is copied; other batches are
    copied into a slot.

    A region serves one consumer: its descriptor is handed to that consumer
    (wire/shm.py, SCM_RIGHTS) before the first slot message, and slots whose
    messages were still queued when it left stay published for ever. So when
    the consumer leaves, the region goes with it and the next consumer gets a
    fresh one, every slot free.
    """

    def __init__(self, cfg: SendConfig, should_stop: Callable[[], bool], peers: _Peers) -> None:
        self.cfg = cfg
        self.should_stop = should_stop
        self.peers = peers
        self.region: shm.Region | None = None
        self.served = 0  # peers.left when the region was made: it serves consumers that came after
        self.like: list[np.ndarray] | None = None  # the first batch, as a template for views
        # A slot handed to the source to fill: (its region, slot, views).
        self.pending: tuple[shm.Region, int, list[np.ndarray]] | None = None
        self.gone = False  # no slot came free in time: the consumer stopped reading

    def handed_over(self) -> bool:
        """Hand the region to the consumer (once per region) before its first slot message; False: not yet."""
        return self.region.handed_over or self.region.hand_over(self.cfg.endpoint, 0.5)

    def moved_on(self) -> bool:
        """True when a consumer has left since the region was made: its slots and its name are no use any more."""
        return self.region is not None and self.peers.update().left != self.served

    def _renew(self) -> None:
        old = self.region
        self.served = self.peers.left
        self.region = shm.Region(old.slots, old.slot_size, reuse=old.reuse)
        old.close()  # still mapped while the source holds views of a pending slot in it

    def _acquire(self) -> int | None:
        """A free slot of the current region (a fresh one if the consumer has changed), or None."""
        while True:
            if self.moved_on():
                self._renew()
            slot = self.region.acquire(lambda: self.should_stop() or self.moved_on(), self.cfg.give_up_after)
            if slot is not None or self.should_stop() or not self.moved_on():
                return slot

    def buffers(self) -> list[np.ndarray] | None:
        """Views into a free slot for the source's next batch (None: let the source allocate).

        None with --reuse-unchanged-slots too: only arrays of the source's own (a synthetic pool) can be
        recognised in a slot that already holds them.
        """
        if self.region is None or self.like is None or self.pending is not None or self.region.reuse:
            return None
        slot = self._acquire()
        if slot is None:
            self.gone = not self.should_stop()
            return None
        views = self.region.views(slot, self.like)
        self.pending = (self.region, slot, views)
        return views

    def prepare(self, arrays) -> tuple[int | None, list[int]]:
        """Put the batch into a slot: (slot, offsets), or (None, []) when stopped or none came free."""
        if self.region is None:  # sized by the first batch; the hwm bounds the slots in flight
            _, slot_size = shm.layout(arrays)
            slot_size = max(slot_size, self.cfg.shm_slot_bytes or 0)
            slots = self.cfg.shm_slots or self.cfg.hwm + HELD_SLOTS
            self.region = shm.Region(max(2, slots), slot_size, reuse=self.cfg.reuse_unchanged_slots)
            self.served = self.peers.update().left
            self.like = [np.empty(a.shape, a.dtype) for a in arrays]
        if self.pending is not None:
            region, slot, views = self.pending
            self.pending = None
            if region is not self.region or self.moved_on():
                slot = self._acquire()  # the consumer changed under the source: copy its batch into a fresh region
            elif len(views) == len(arrays) and all(a is v for a, v in zip(arrays, views, strict=True)):
                self.region.publish(slot)  # decoded in place: nothing to copy
                return slot, shm.layout(arrays)[0]
            # else the source made arrays of its own: they are copied into the slot it was offered
        else:
            slot = self._acquire()
        if slot is None:
            return None, []
        offsets = self.region.write(slot, arrays)
        self.region.publish(slot)  # every byte is written: only now may the consumer see the slot
        return slot, offsets

    def close(self) -> None:
        if self.region is not None:
            self.region.close()


def run(
    source: Source,
    worker: int,
    cfg: SendConfig,
    counters: Counters | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_ready: Callable[[], None] = lambda: None,
) -> int:
    """Send batches until `count` is reached or `should_stop()`; returns an exit code."""
    if shm.is_shm(cfg.endpoint) and cfg.fmt != "native":
        raise EndpointError(f"endpoint {cfg.endpoint!r}: shm:// sends slot messages in the native format only")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, cfg.hwm)
    # Queue only to live connections, so "sent" means a consumer is there to take it.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    auth = None
    bound = False
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    peers = _Peers(monitor)
    slots = _SlotSender(cfg, should_stop, peers) if shm.is_shm(cfg.endpoint) else None
    try:
        if cfg.curve_keys:
            auth = curve.secure(sock, cfg.curve_keys, server=cfg.bind)
        if slots is not None:
            shm.restrict_to_user(sock)  # when we bind: only this user's consumers
        attach(sock, cfg.endpoint, cfg.bind, cfg.allow_remote, secured=bool(cfg.curve_keys))
        bound = cfg.bind
        on_ready()
        return _stream(source, worker, cfg, sock, slots, peers, counters, should_stop)
    finally:
        # Let queued messages reach the consumer, but not forever if it is gone or we were stopped.
        sock.disable_monitor()
        monitor.close(0)
        sock.close(linger=0 if should_stop() else _linger_ms(cfg.give_up_after))
        if auth is not None:
            auth.stop()
        ctx.term()
        if slots is not None:
            slots.close()
        if bound:  # libzmq leaves a bound ipc (or shm://'s slot-message) socket's file behind
            release(cfg.endpoint, bind=True)


def _stream(
    source: Source,
    worker: int,
    cfg: SendConfig,
    sock,
    slots: _SlotSender | None,
    peers: _Peers,
    counters: Counters | None,
    should_stop: Callable[[], bool],
) -> int:
    """The send loop on a connected socket: pace, put each batch on the wire, count it; an exit code."""
    if slots is not None and getattr(source, "fills_buffers", False):
        batches = source(worker, buffers=slots.buffers)
    else:
        batches = source(worker)
    # A source may report counters of its own (e.g. bad files skipped) in each header.
    source_extras = getattr(source, "header_extras", lambda worker: {})
    telemetry = _Telemetry()
    seq = 0
    t_start = time.perf_counter()
    while cfg.count is None or seq < cfg.count:
        t0 = time.perf_counter()
        arrays = next(batches, None)
        if slots is not None and slots.gone:
            return SLOTS_HELD
        if arrays is None:  # a finite source ran out
            break
        t1 = time.perf_counter()
        images = len(arrays[0])
        if cfg.rate:
            # Pace against the start, so a stall does not let the producer burst afterwards.
            _pace(t_start + seq * images / cfg.rate, should_stop)
        t2 = time.perf_counter()
        extras = {**telemetry.summary, **source_extras(worker), "sent": seq} if cfg.fmt == "native" else None
        nbytes = STALE
        while nbytes == STALE:
            frames = None
            if slots is not None:
                slot, offsets = slots.prepare(arrays)
                if slot is None:  # no slot came back: the consumer holds them all, or stopped reading
                    return DONE if should_stop() else SLOTS_HELD
                frames = shm.encode(arrays, cfg.producer_id, seq, slots.region.name, slot, offsets, extras)
            stale = slots.moved_on if slots is not None else lambda: False
            ready = slots.handed_over if slots is not None else lambda: True
            nbytes = _send(sock, arrays, cfg, seq, extras, should_stop, frames, stale, ready)
        if nbytes is None:
            return DONE if should_stop() else CONSUMER_GONE
        t3 = time.perf_counter()
        telemetry.record(images, t1 - t0, t3 - t2)
        seq += 1
        if counters is not None:
            counters.add(images, nbytes, t3 - t2, t1 - t0)
        if should_stop():
            return DONE
    _wait_for_delivery(peers, cfg, should_stop)
    return DONE
