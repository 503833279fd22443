"""Shared-memory slots for `shm://NAME` endpoints: the batch in shared memory, a slot message over ZMQ.

On one machine a batch then costs one write by the producer (into a slot) and
at most one copy by the consumer (none when its tensors are the slot itself),
instead of a socket write, a socket read and a copy. The layout is in
docs/wire.md ("Shared memory"); the C++ consumer is zmq_ops/src/shm.cc.

- Each producer worker owns one region: an anonymous memory file
  (``memfd_create``, labelled ``fb-<pid>-<32 random hex>``) with a header, one
  state word per slot (0 free, 1 published, 2 taken by the consumer) and N
  slots. It has no name in any folder, so when every process that holds it
  dies (even by SIGKILL) the kernel frees it: nothing can be left in /dev/shm.
  Its size is sealed (F_SEAL_SHRINK | F_SEAL_GROW), so nobody can make a
  reader fault by shrinking it.
- The region reaches the consumer over a unix socket with SCM_RIGHTS: the
  consumer listens on an abstract address derived from NAME, checks that the
  peer is this user (SO_PEERCRED) and is the process the region is labelled
  with; the producer checks that the listener is this user before handing
  the descriptor over. Only then are slot messages (a native header with
  magic ``FBWS`` and a descriptor frame naming region, slot and offsets) sent
  over ZMQ, on an abstract ipc address that admits only this user's
  processes. A producer that dies mid-write has sent nothing, so no
  half-written slot is ever seen.
- The consumer checks every field against the region before it reads, claims
  the slot (1 -> 2), and frees it (-> 0) once it is done with it (after its
  copy, or when the last tensor over the slot is dropped).
- Back-pressure is the bounded number of slots: a producer waits for a free
  one and gives up, like a blocked send, after ``--give-up-after`` seconds.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import re
import secrets
import select
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wire import native, strings
from wire.errors import WireError, byte_view

SCHEME = "shm://"
SLOT_MAGIC = b"FBWS"
DESC_MAGIC = b"FBSL"
REGION_MAGIC = b"FBSR"
REGION_VERSION = 1
MAX_SLOTS = 1024
HEADER = 64
STATE_STRIDE = 64
PAGE = 4096
ALIGN = 64
SHM_DIR = Path("/dev/shm")
FREE, PUBLISHED, TAKEN = 0, 1, 2
HANDOVER_MAGIC = b"FBHO"  # a region's descriptor handed to the consumer: magic + region name, fd in SCM_RIGHTS
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
HANDOVER_WAIT_S = 2.0  # how long a consumer waits for the descriptor of a region a slot message names
MAX_PENDING = 256  # descriptors handed over but not yet named by a slot message
PEER_WAIT_S = 5.0  # a hand-over peer of this user that has sent nothing after this long is dropped
MAX_PEERS = 64  # hand-over peers waiting at once; the oldest is dropped past it

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_REGION = re.compile(r"/fb-[0-9]+-[0-9a-f]{32}")
_REGION_HEAD = struct.Struct("<4sIIIQQ")
_DESC_HEAD = struct.Struct("<4sIH")


class ShmError(ValueError):
    """A shared-memory endpoint or region that cannot be used; the message names it."""


def is_shm(endpoint: str) -> bool:
    return isinstance(endpoint, str) and endpoint.startswith(SCHEME)


def check_name(endpoint: str) -> str:
    name = endpoint[len(SCHEME) :]
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ShmError(f"endpoint {endpoint!r}: NAME must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return name


def zmq_endpoint(endpoint: str) -> str:
    """The ipc:// endpoint that carries shm://NAME's slot messages (the same one the C++ side derives).

    An abstract unix address (Linux): it has no file, so nothing is left behind
    however its binder ends; the binding side admits only this user's processes
    (ZMQ_IPC_FILTER_UID).
    """
    return f"ipc://@feedbench-{os.getuid()}/{check_name(endpoint)}.sock"


def handover_address(endpoint: str) -> bytes:
    """The abstract unix address where shm://NAME's consumer takes regions' descriptors."""
    return f"\0feedbench-{os.getuid()}/{check_name(endpoint)}.fd".encode()


def served(endpoint: str) -> bool:
    """True when a consumer has bound shm://NAME's slot-message socket (abstract: listed in /proc/net/unix)."""
    want = {zmq_endpoint(endpoint)[len("ipc://") :]}
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(ln.split()[-1] in want for ln in lines if len(ln.split()) >= 8)


def restrict_to_user(sock) -> None:
    """Admit only this user's processes to a bound ZMQ ipc socket (no-op where libzmq lacks the filter)."""
    import zmq  # the one place this module needs ZMQ; imported late to keep importing it light

    try:
        sock.setsockopt(getattr(zmq, "IPC_FILTER_UID", 59), os.getuid())
    except zmq.ZMQError:
        pass


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket, as the kernel saw it connect."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def _round(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def layout(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    """Offsets of each array in a slot (64-byte aligned) and the slot size (whole pages)."""
    offsets, at = [], 0
    for a in arrays:
        offsets.append(at)
        at = _round(at + strings.nbytes(a), ALIGN)
    return offsets, _round(max(at, 1), PAGE)


class Region:
    """A producer's region: N slots in an anonymous memory file, freed when its last holder lets go."""

    def __init__(self, slots: int, slot_size: int, reuse: bool = False) -> None:
        """`reuse`: a slot that already holds the very same read-only arrays is published again unwritten."""
        if not 1 <= slots <= MAX_SLOTS:
            raise ShmError(f"a region holds 1..{MAX_SLOTS} slots, not {slots}")
        self.slots, self.slot_size = slots, _round(slot_size, PAGE)
        self.data_offset = _round(HEADER + STATE_STRIDE * slots, PAGE)
        size = self.data_offset + slots * self.slot_size
        self.name = f"/fb-{os.getpid()}-{secrets.token_hex(16)}"
        self.handed_over = False  # its descriptor has reached the current consumer
        self.reuse = reuse
        fd = os.memfd_create(self.name[1:], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        head = _REGION_HEAD.pack(REGION_MAGIC, REGION_VERSION, slots, 0, self.slot_size, self.data_offset)
        self._map[: len(head)] = head
        buf = np.frombuffer(self._map, dtype=np.uint8)
        self._state = buf[HEADER : HEADER + STATE_STRIDE * slots].view(np.uint32)[:: STATE_STRIDE // 4]
        self._data = buf[self.data_offset :]
        self._next = 0
        self._holds: list[tuple[np.ndarray, ...] | None] = [None] * slots  # read-only arrays a slot already holds

    def acquire(self, should_stop: Callable[[], bool], give_up_after: float | None) -> int | None:
        """A free slot (round robin), or None when stopped or no slot came free for `give_up_after` s.

        `give_up_after` None or 0 waits as long as we are not stopped.
        """
        deadline = time.monotonic() + give_up_after if give_up_after else math.inf
        pause = 0.0
        while True:
            for k in range(self.slots):
                i = (self._next + k) % self.slots
                if self._state[i] == FREE:
                    self._next = (i + 1) % self.slots
                    return i
            if should_stop() or time.monotonic() > deadline:
                return None
            pause = min(0.002, pause + 0.0001)  # back off to a 2 ms poll while the consumer is busy
            time.sleep(pause)

    def write(self, slot: int, arrays: Sequence[np.ndarray]) -> list[int]:
        """Copy the batch into `slot`; returns the offsets for the slot message.

        With `reuse`, read-only arrays (a synthetic source's pool) that the slot
        already holds from an earlier round are not copied again: nobody can
        have changed them. Off by default: a consumer that uses slots in place
        may write into them, and a real producer writes every batch anyway.
        """
        offsets, size = layout(arrays)
        if size > self.slot_size:
            raise ShmError(f"a {size}-byte batch does not fit the region's {self.slot_size}-byte slots")
        held = self._holds[slot]
        if held is not None and len(held) == len(arrays) and all(a is b for a, b in zip(held, arrays, strict=True)):
            return offsets
        self._holds[slot] = None
        base = slot * self.slot_size
        for i, (a, off) in enumerate(zip(arrays, offsets, strict=True)):
            src = strings.pack(a, i) if strings.is_strings(a) else np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            np.copyto(self._data[base + off : base + off + src.nbytes], src)
        if self.reuse and all(not a.flags.writeable and a.base is None for a in arrays):
            self._holds[slot] = tuple(arrays)  # kept alive, so their identity cannot be reused
        return offsets

    def views(self, slot: int, like: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Writable arrays shaped like `like`, laid out in `slot` as write() would: fill them in place.

        A source that decodes straight into these needs no copy into the slot.
        """
        offsets, size = layout(like)
        if size > self.slot_size:
            raise ShmError(f"a {size}-byte batch does not fit the region's {self.slot_size}-byte slots")
        self._holds[slot] = None
        base = slot * self.slot_size
        return [
            self._data[base + off : base + off + a.nbytes].view(a.dtype).reshape(a.shape)
            for a, off in zip(like, offsets, strict=True)
        ]

    def publish(self, slot: int) -> None:
        """Mark a written slot as the consumer's (after every byte of it is written)."""
        self._state[slot] = PUBLISHED

    def hand_over(self, endpoint: str, give_up_after: float = HANDOVER_WAIT_S) -> bool:
        """Pass the region's descriptor to shm://NAME's consumer (SCM_RIGHTS); False if none takes it in time.

        The listener must belong to this user (SO_PEERCRED), or nothing is sent.
        Once this returns True the descriptor is queued in the consumer's socket,
        so a slot message sent after it always finds its region.
        """
        deadline = time.monotonic() + give_up_after
        while True:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as s:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    s.connect(handover_address(endpoint))
                    _, uid = _peer(s)
                    if uid != os.getuid():
                        raise ShmError(f"{endpoint}: its consumer runs as user {uid}, not as this user")
                    socket.send_fds(s, [HANDOVER_MAGIC + self.name.encode()], [self._fd])
                    self.handed_over = True
                    return True
                except (ConnectionRefusedError, FileNotFoundError, TimeoutError, BlockingIOError):
                    pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        """Close and unmap (a consumer's mapping, if any, stays valid: the memory lives until it unmaps too)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._state = self._data = None
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass


def encode(
    arrays: Sequence[np.ndarray],
    producer_id: int,
    seq: int,
    region: str,
    slot: int,
    offsets: Sequence[int],
    extras: dict | None = None,
) -> list[bytes]:
    """The two frames of a slot message: a native header with magic FBWS, and the slot descriptor."""
    header = SLOT_MAGIC + native.encode_header(arrays, producer_id, seq, extras=extras)[4:]
    name = region.encode()
    desc = _DESC_HEAD.pack(DESC_MAGIC, slot, len(name)) + name + struct.pack(f"<{len(offsets)}Q", *offsets)
    return [header, desc]


@dataclass(frozen=True)
class SlotRef:
    """Where a slot message says its batch is."""

    region: str
    slot: int
    offsets: tuple[int, ...]


def is_slot_message(frames: Sequence[bytes | memoryview]) -> bool:
    return bool(frames) and bytes(byte_view(frames[0])[:4]) == SLOT_MAGIC


def decode(frames: Sequence[bytes | memoryview]) -> tuple[native.Header, SlotRef]:
    """Parse a slot message, checking every field; nothing is read from shared memory yet."""
    if len(frames) != 2:
        raise WireError("frames", f"a slot message has 2 frames (header, slot), got {len(frames)}")
    head = byte_view(frames[0])
    if bytes(head[:4]) != SLOT_MAGIC:
        raise WireError("magic", f"{bytes(head[:4])!r} is not {SLOT_MAGIC!r}")
    header = native.decode_header(native.MAGIC + bytes(head[4:]))
    desc = byte_view(frames[1])
    if len(desc) < _DESC_HEAD.size:
        raise WireError("slot.length", f"{len(desc)} bytes, shorter than the {_DESC_HEAD.size}-byte fixed part")
    magic, slot, name_len = _DESC_HEAD.unpack_from(desc, 0)
    n = len(header.dtypes)
    expected = _DESC_HEAD.size + name_len + 8 * n
    if magic != DESC_MAGIC:
        raise WireError("slot.magic", f"{bytes(magic)!r} is not {DESC_MAGIC!r}")
    if len(desc) != expected:
        raise WireError("slot.length", f"{len(desc)} bytes, expected {expected} for {n} tensors")
    region = bytes(desc[_DESC_HEAD.size : _DESC_HEAD.size + name_len]).decode("ascii", "replace")
    if not _REGION.fullmatch(region):
        raise WireError("slot.region", f"{region!r} is not a feedbench region name")
    offsets = struct.unpack_from(f"<{n}Q", desc, _DESC_HEAD.size + name_len)
    return header, SlotRef(region, slot, offsets)


class Handover:
    """The consumer's end of the region hand-over: an abstract unix socket taking descriptors (SCM_RIGHTS).

    A descriptor is kept only from a peer that runs as this user and is the
    process its region is labelled with (/fb-<pid>-...); it waits here until a
    slot message names the region.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self._sock.bind(handover_address(endpoint))
            self._sock.listen(128)
        except OSError as e:
            self._sock.close()
            why = "address already in use" if e.errno == 98 else e.strerror
            raise ShmError(f"endpoint {endpoint!r}: cannot bind: {why}") from None
        self._sock.setblocking(False)
        self._fds: dict[str, int] = {}  # insertion-ordered: the oldest is dropped past MAX_PENDING
        # Peers of this user that connected but have not sent yet: conn -> (pid, when it is dropped).
        self._peers: dict[socket.socket, tuple[int, float]] = {}

    def take(self, name: str, wait_s: float = HANDOVER_WAIT_S) -> int | None:
        """The descriptor of region `name` (yours to close), waiting up to `wait_s`; None if it never came."""
        deadline = time.monotonic() + wait_s
        while True:
            self._drain()
            if name in self._fds:
                return self._fds.pop(name)
            left = deadline - time.monotonic()
            if left <= 0 or self._sock is None:
                return None
            select.select([self._sock, *self._peers], [], [], min(left, 0.1))

    def _drain(self) -> None:
        """Accept every waiting peer and read those that have sent, without ever waiting on one.

        Another user's peer is closed before anything is read from it; a peer
        of this user that connects and sends nothing is dropped after
        PEER_WAIT_S, and at most MAX_PEERS wait at once (the oldest goes):
        no peer delays another's hand-over.
        """
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            try:
                pid, uid = _peer(conn)
            except OSError:
                conn.close()
                continue
            if uid != os.getuid():
                conn.close()
                continue
            conn.setblocking(False)
            self._peers[conn] = (pid, time.monotonic() + PEER_WAIT_S)
            self._read(conn)  # a producer sends as it connects: read it before any later peer can push it out
            if len(self._peers) > MAX_PEERS:
                oldest = next(iter(self._peers))
                del self._peers[oldest]
                oldest.close()
        for conn in list(self._peers):
            self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        """Take what peer `conn` sent, if it has, and forget it; drop it once it has waited PEER_WAIT_S."""
        pid, drop_at = self._peers[conn]
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 4 + 64, 2)
        except (BlockingIOError, InterruptedError):
            if time.monotonic() < drop_at:
                return
            msg, fds = b"", []
        except OSError:
            msg, fds = b"", []
        del self._peers[conn]
        conn.close()
        self._keep(pid, msg, fds)

    def _keep(self, pid: int, msg: bytes, fds: list[int]) -> None:
        """Keep the descriptor a peer sent if it is one region labelled with the peer's own pid; else close it."""
        name = msg[4:].decode("ascii", "replace")
        ok = msg[:4] == HANDOVER_MAGIC and len(fds) == 1 and _REGION.fullmatch(name) is not None
        if not (ok and region_pid(name) == pid and name not in self._fds):
            for fd in fds:
                os.close(fd)
            return
        self._fds[name] = fds[0]
        if len(self._fds) > MAX_PENDING:
            os.close(self._fds.pop(next(iter(self._fds))))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for conn in self._peers:
            conn.close()
        self._peers.clear()


class _Mapped:
    def __init__(self, name: str, fd: int | None) -> None:
        if fd is None:
            raise WireError("slot.region", f"{name} was never handed over by a producer of this user")
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid():
                raise WireError("slot.region", f"{name} does not belong to this user")
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
                raise WireError("slot.region", f"{name}: its size is not sealed")
            if st.st_size < HEADER:
                raise WireError("region.size", f"{name} has {st.st_size} bytes, less than its header")
            self.map = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        magic, version, slots, _, slot_size, data_offset = _REGION_HEAD.unpack_from(self.map, 0)
        if magic != REGION_MAGIC:
            raise WireError("region.magic", f"{name}: {magic!r} is not {REGION_MAGIC!r}")
        if version != REGION_VERSION:
            raise WireError("region.version", f"{name}: unknown version {version}")
        if not 1 <= slots <= MAX_SLOTS:
            raise WireError("region.slots", f"{name}: {slots} is outside 1..{MAX_SLOTS}")
        if slot_size == 0 or slot_size % PAGE:
            raise WireError("region.slot_size", f"{name}: {slot_size} is not a positive multiple of {PAGE}")
        if data_offset != _round(HEADER + STATE_STRIDE * slots, PAGE):
            raise WireError("region.data_offset", f"{name}: {data_offset} is not where the slots start")
        if data_offset + slots * slot_size != st.st_size:
            raise WireError("region.size", f"{name}: {st.st_size} bytes do not hold {slots} slots of {slot_size}")
        self.slots, self.slot_size, self.data_offset = slots, slot_size, data_offset
        buf = np.frombuffer(self.map, dtype=np.uint8)
        self.state = buf[HEADER : HEADER + STATE_STRIDE * slots].view(np.uint32)[:: STATE_STRIDE // 4]
        self.data = buf[data_offset:]


def region_pid(name: str) -> int:
    """The producer worker that made region `name` (/fb-<pid>-<hex>)."""
    return int(name.split("-")[1])


def pid_alive(pid: int) -> bool:
    """False once process `pid` has exited (and been reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SlotReader:
    """The consumer's side in Python: maps producers' regions and copies batches out of their slots.

    A region is unmapped once it can carry no more batches: its producer has
    exited, or has made a newer region (it does so for each new consumer).
    This happens when a new region is mapped, so a long-running consumer holds
    one region per live producer worker, not one per producer it ever met.
    Slot messages still queued for an unmapped ("retired") region are
    skipped: their producer is gone, and so are those batches.
    """

    MAX_REGIONS = 256
    RETIRED = 4096  # names of unmapped regions remembered, to skip their late slot messages
    POOL = 8  # output arrays kept per (dtype, shape), reused once the caller has dropped them

    def __init__(self, endpoint: str | None = None) -> None:
        """`endpoint` (shm://NAME): listen there for regions handed over by producers."""
        self._handover = Handover(endpoint) if endpoint is not None else None
        self._regions: dict[str, _Mapped] = {}
        self._retired: dict[str, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._pool: dict[tuple, list[np.ndarray]] = {}

    def retired(self, region: str) -> bool:
        """True for a region this reader unmapped because its producer moved on or exited."""
        return region in self._retired

    def _prune(self, new: str) -> None:
        """Unmap regions whose producer has exited or has made `new` in their place."""
        pid = region_pid(new)
        for name in [n for n in self._regions if region_pid(n) == pid or not pid_alive(region_pid(n))]:
            _unmap(self._regions.pop(name))
            self._retired[name] = None
            if len(self._retired) > self.RETIRED:
                del self._retired[next(iter(self._retired))]

    def _out(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """An output array: a pooled one nobody else references any more, or a new one.

        Reusing arrays whose pages are already mapped saves the page faults of a
        fresh multi-megabyte allocation on every batch (as much as the copy itself).
        """
        pool = self._pool.setdefault((dtype.str, shape), [])
        for a in pool:
            if sys.getrefcount(a) <= 3:  # the pool's list, the loop variable, getrefcount's argument
                return a
        a = np.empty(shape, dtype)
        if len(pool) < self.POOL:
            pool.append(a)
        return a

    def read(self, header: native.Header, ref: SlotRef) -> list[np.ndarray]:
        """The batch as new arrays (the one copy), after which the slot is free again."""
        r = self._regions.get(ref.region)
        if r is None:
            fd = self._handover.take(ref.region) if self._handover is not None else None
            r = _Mapped(ref.region, fd)
            self._prune(ref.region)  # only now: a region that cannot be mapped retires nothing
            if len(self._regions) >= self.MAX_REGIONS:
                _unmap(r)
                raise WireError("slot.region", f"more than {self.MAX_REGIONS} live producers' regions mapped")
            self._regions[ref.region] = r
        if ref.slot >= r.slots:
            raise WireError("slot.index", f"{ref.slot} >= the region's {r.slots} slots")
        views = []
        for i, (dtype, shape, off) in enumerate(zip(header.dtypes, header.shapes, ref.offsets, strict=True)):
            start = ref.slot * r.slot_size + off
            if dtype == strings.DTYPE:  # its size is in its length table, read once the slot is ours
                views.append((start, max(0, r.slot_size - off)))
                continue
            nbytes = math.prod(shape) * dtype.itemsize
            if off + nbytes > r.slot_size:
                raise WireError(f"tensor[{i}].offset", f"{off} + {nbytes} bytes overrun the {r.slot_size}-byte slot")
            views.append(r.data[start : start + nbytes].view(dtype).reshape(shape))
        if r.state[ref.slot] != PUBLISHED:
            raise WireError("slot.state", f"slot {ref.slot} of {ref.region} is not published")
        r.state[ref.slot] = TAKEN
        try:
            return [self._copy(r, v, n, i) for i, (v, n) in enumerate(zip(views, header.shapes, strict=True))]
        finally:
            r.state[ref.slot] = FREE

    def _copy(self, r: _Mapped, view: np.ndarray | tuple[int, int], shape: tuple[int, ...], i: int) -> np.ndarray:
        """Tensor i out of a taken slot: a pooled copy, or its byte strings once their table checks out."""
        if isinstance(view, tuple):
            start, room = view
            size = strings.extent(r.data[start : start + room], shape[0], i, room)
            return strings.unpack(r.data[start : start + size], shape[0], i)
        out = self._out(view.dtype, view.shape)
        np.copyto(out, view)
        return out

    def close(self) -> None:
        if self._handover is not None:
            self._handover.close()
        for r in self._regions.values():
            _unmap(r)
        self._regions.clear()
        self._pool.clear()


def _unmap(r: _Mapped) -> None:
    r.state = r.data = None
    try:
        r.map.close()
    except BufferError:  # a view is still alive somewhere; the mapping goes with it
        pass
