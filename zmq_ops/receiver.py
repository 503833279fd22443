"""A native receiver that writes batches straight into buffers you own (no TensorFlow).

Native threads (C++, the same receive core as the TensorFlow op: socket,
decoders, CURVE, sequence accounting) take each batch off a ZMQ PULL socket
and copy it once into one slot of a ring of caller-provided buffers, e.g.
pinned torch tensors. Python only asks for the next filled slot and gives it
back when done, so no Python runs per byte::

    slots = [[torch.empty((64, 224, 224, 3), dtype=torch.uint8).pin_memory(),
              torch.empty((64,), dtype=torch.int32).pin_memory()] for _ in range(4)]
    with Receiver("ipc:///tmp/feed", [("uint8", (64, 224, 224, 3)), ("int32", (64,))], slots) as r:
        i = r.next()           # blocks with the GIL released
        images, labels = slots[i]
        ...                    # copy to the device
        r.release(i)

With ``zero_copy=True`` there are no buffers to give: ``slots`` is how many
batches you may hold at once, and ``next_arrays()`` returns numpy arrays over
the batch where it already is (a shm:// producer's slot, or the received
frames); ``torch.from_numpy`` makes tensors of them without a copy. The batch
(and the producer's slot) is handed back when the last of them is dropped::

    with Receiver("shm://feed", specs, 8, zero_copy=True) as r:
        images, labels = (torch.from_numpy(a) for a in r.next_arrays())

Buffers may be torch tensors, numpy arrays (anything with `data_ptr()` or
`__array_interface__`, checked for size and contiguity) or raw addresses
(ints, trusted). This module imports neither torch nor TensorFlow. The
library is built by `python zmq_ops/build.py --receiver` (done on first use).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from wire.dtypes import code_of
from wire.endpoints import check as check_endpoint

_ERRLEN = 1024
_LIB: ctypes.CDLL | None = None
_LIB_LOCK = threading.Lock()


class ReceiveTimeout(TimeoutError):
    """No batch arrived within the timeout; the message names the endpoint (and refused CURVE peers)."""


class BatchError(ValueError):
    """A malformed batch, or one whose fields differ from the specs; the message names the field."""


def library() -> ctypes.CDLL:
    """The receiver library, built on first use if it is missing or stale."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            from zmq_ops.build import build_receiver

            _LIB = bind(ctypes.CDLL(str(build_receiver(verbose=False))))
        return _LIB


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the C API's signatures on a loaded receiver library."""
    c_int, c_i64, c_p, c_char_p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
    lib.fb_receiver_open.restype = c_p
    lib.fb_receiver_open.argtypes = [
        c_char_p, c_int, ctypes.POINTER(c_int), ctypes.POINTER(c_int), ctypes.POINTER(c_i64), c_int,
        ctypes.POINTER(c_p), c_int, c_i64, c_i64, c_int, c_char_p, c_int, c_int, c_p, c_char_p, ctypes.c_size_t,
    ]  # fmt: skip
    lib.fb_receiver_data.restype = c_int
    lib.fb_receiver_data.argtypes = [c_p, c_int, ctypes.POINTER(c_p), c_int, c_char_p, ctypes.c_size_t]
    lib.fb_receiver_next.restype = c_int
    lib.fb_receiver_next.argtypes = [c_p, c_i64, c_char_p, ctypes.c_size_t]
    lib.fb_receiver_release.restype = c_int
    lib.fb_receiver_release.argtypes = [c_p, c_int, c_char_p, ctypes.c_size_t]
    lib.fb_receiver_stats.restype = c_int
    lib.fb_receiver_stats.argtypes = [c_p, ctypes.POINTER(c_i64), c_int, ctypes.POINTER(c_i64)]
    lib.fb_receiver_bad.restype = c_i64
    lib.fb_receiver_bad.argtypes = [c_p]
    lib.fb_receiver_stop.argtypes = [c_p]
    lib.fb_receiver_close.argtypes = [c_p]
    return lib


def _address(buf: Any, nbytes: int, where: str) -> int:
    """The address of a buffer, after checking it is contiguous and large enough."""
    if isinstance(buf, int):
        return buf
    if hasattr(buf, "data_ptr"):  # a torch tensor, without importing torch
        if not buf.is_contiguous():
            raise ValueError(f"{where}: buffer is not contiguous")
        have = buf.numel() * buf.element_size()
        ptr = buf.data_ptr()
    elif hasattr(buf, "__array_interface__"):
        arr = np.asarray(buf)
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise ValueError(f"{where}: buffer is not a writeable C-contiguous array")
        have, ptr = arr.nbytes, arr.ctypes.data
    else:
        raise TypeError(f"{where}: expected a tensor, an array or an address, got {type(buf).__name__}")
    if have < nbytes:
        raise ValueError(f"{where}: buffer holds {have} bytes, the field needs {nbytes}")
    return ptr


# void hook(void* base, uint64_t size, int mapped): see shm::MapHook in zmq_ops/src/shm.h.
MAP_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int)


class _Held:
    """One zero-copy batch: gives its ring slot (and the producer's slot) back when the last array over it dies."""

    def __init__(self, receiver: Receiver, slot: int) -> None:
        self.receiver, self.slot = receiver, slot
        receiver._outstanding += 1

    def __del__(self) -> None:
        r = self.receiver
        r._outstanding -= 1
        if r._handle:
            try:
                r._lib.fb_receiver_release(r._handle, int(self.slot), None, 0)
            except Exception:
                pass
            if r._closed and r._outstanding == 0:
                r._free()  # closed while arrays were alive: the memory under them lives until now


class _View:
    """An array interface over one tensor of a held batch; keeps the batch alive while numpy uses it."""

    def __init__(self, held: _Held, address: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self._held = held
        self.__array_interface__ = {
            "data": (address, False), "shape": shape, "typestr": dtype.str, "version": 3,
        }  # fmt: skip


def _slot_list(slots: Sequence[Sequence[Any]] | int, tensors: int, zero_copy: bool) -> Sequence[Sequence[Any]]:
    """The slots' buffers; with zero copy, `slots` is a count and each slot's addresses are filled in later."""
    if zero_copy:
        if not isinstance(slots, int) or slots < 1:
            raise ValueError("a zero-copy Receiver takes `slots` as the number of batches one may hold (>= 1)")
        return [[0] * tensors for _ in range(slots)]
    if isinstance(slots, int):
        raise ValueError("Receiver needs buffers for each slot (or zero_copy=True)")
    return slots


class Receiver:
    """Native receive threads filling a ring of caller-owned slots from a ZMQ endpoint.

    `specs` is one (dtype, shape) per tensor of a batch; `slots` one list of
    buffers per slot, in the order of `specs`. `timeout_ms` is next()'s wait
    (-1: forever); `max_msg_size` caps a frame (-1: unlimited); `curve_keys`
    is a `python -m producers make-keys` folder (CURVE encryption, and only
    producers with the folder's client key are admitted). `zero_copy`: no
    buffers; `slots` is an int, how many batches may be held at once, and
    next_arrays() gives arrays over each batch in place (`zero_copy` says
    which path ran).
    """

    def __init__(
        self,
        endpoint: str,
        specs: Sequence[tuple[str | np.dtype, Sequence[int]]],
        slots: Sequence[Sequence[Any]] | int,
        hwm: int = 4,
        timeout_ms: int = -1,
        max_msg_size: int = -1,
        bind: bool = True,
        curve_keys: str | os.PathLike | None = None,
        threads: int = 2,
        allow_remote: bool = False,
        zero_copy: bool = False,
        on_region: Any = None,
    ) -> None:
        """`on_region(base, size, mapped)`: called as shm:// regions are mapped (True) and just before they are
        unmapped (False), from the receive threads; e.g. `feeders.cuda_slots.cuda_host_register()`."""
        check_endpoint(endpoint, bind, allow_remote, secured=bool(curve_keys))
        self.zero_copy = bool(zero_copy)
        slots = _slot_list(slots, len(specs), self.zero_copy)
        self.endpoint = endpoint
        self.specs = [(np.dtype(d), tuple(int(x) for x in shape)) for d, shape in specs]
        if not self.specs or not slots:
            raise ValueError("Receiver needs at least one spec and one slot")
        codes = [code_of(d, f"specs[{i}].dtype") for i, (d, _) in enumerate(self.specs)]
        ptrs = []
        for s, bufs in enumerate(slots):
            if len(bufs) != len(self.specs):
                raise ValueError(f"slots[{s}] has {len(bufs)} buffers for {len(self.specs)} specs")
            for i, (buf, (dtype, shape)) in enumerate(zip(bufs, self.specs, strict=True)):
                ptrs.append(_address(buf, dtype.itemsize * int(np.prod(shape)), f"slots[{s}][{i}]"))
        self._buffers = [list(b) for b in slots]  # keep them alive while the threads write into them
        self._lib = library()
        n = len(self.specs)
        ndims = [len(shape) for _, shape in self.specs]
        dims = [x for _, shape in self.specs for x in shape]
        err = ctypes.create_string_buffer(_ERRLEN)
        self._lock = threading.Lock()
        self._closed = False
        self._outstanding = 0  # zero-copy batches whose arrays are alive
        self._hook = None
        if on_region is not None:

            def hook(base: int, size: int, mapped: int) -> None:
                try:
                    on_region(base, size, bool(mapped))
                except Exception as e:  # never let an exception unwind through C++
                    print(f"warning: on_region for {endpoint}: {e}", file=sys.stderr)

            self._hook = MAP_HOOK(hook)  # kept alive as long as the library may call it
        self._handle = self._lib.fb_receiver_open(
            endpoint.encode(), n, (ctypes.c_int * n)(*codes), (ctypes.c_int * n)(*ndims),
            (ctypes.c_int64 * max(1, len(dims)))(*dims), len(slots), (ctypes.c_void_p * len(ptrs))(*ptrs),
            int(hwm), int(timeout_ms), int(max_msg_size), int(bind),
            os.fsencode(curve_keys) if curve_keys else None, int(threads), int(self.zero_copy),
            ctypes.cast(self._hook, ctypes.c_void_p) if self._hook else None, err, _ERRLEN,
        )  # fmt: skip
        if not self._handle:
            raise ValueError(err.value.decode(errors="replace"))

    def next(self, timeout_ms: int | None = None) -> int:
        """The index of the next filled slot (yours until release()); raises on timeout or a bad batch."""
        with self._lock:
            if not self._handle:
                raise RuntimeError(f"receiver for {self.endpoint} is closed")
            err = ctypes.create_string_buffer(_ERRLEN)
            slot = self._lib.fb_receiver_next(self._handle, -2 if timeout_ms is None else int(timeout_ms), err, _ERRLEN)
        if slot >= 0:
            return slot
        why = err.value.decode(errors="replace")
        if slot == -1:
            raise ReceiveTimeout(why)
        if slot == -2:
            raise BatchError(why)
        raise RuntimeError(why)

    def next_arrays(self, timeout_ms: int | None = None) -> list[np.ndarray]:
        """Zero-copy: the next batch as arrays over it in place; given back when the last of them is dropped."""
        if not self.zero_copy:
            raise RuntimeError("next_arrays() needs a Receiver opened with zero_copy=True")
        slot = self.next(timeout_ms)
        held = _Held(self, slot)  # from here on, dropping it gives the slot back
        n = len(self.specs)
        ptrs = (ctypes.c_void_p * n)()
        err = ctypes.create_string_buffer(_ERRLEN)
        if self._lib.fb_receiver_data(self._handle, slot, ptrs, n, err, _ERRLEN) != 0:
            raise RuntimeError(err.value.decode(errors="replace"))
        return [np.asarray(_View(held, ptrs[i] or 0, dtype, shape)) for i, (dtype, shape) in enumerate(self.specs)]

    def release(self, slot: int) -> None:
        """Give a slot back to the receive threads."""
        err = ctypes.create_string_buffer(_ERRLEN)
        if not self._handle:
            raise RuntimeError(f"receiver for {self.endpoint} is closed")
        if self._lib.fb_receiver_release(self._handle, int(slot), err, _ERRLEN) != 0:
            raise ValueError(err.value.decode(errors="replace"))

    def producers(self) -> list[tuple[int, int, int, int, int]]:
        """One row per producer: (producer_id, received, lost, duplicated, restarts)."""
        rows, _ = self._stats()
        return rows

    def stats(self) -> tuple[list[tuple[int, int, int, int, int]], int, int]:
        """(producer rows as in producers(), messages, bytes) accepted so far."""
        rows, totals = self._stats()
        return rows, totals[0], totals[1]

    def bad_messages(self) -> int:
        """Malformed or mismatched messages (and receive errors) met so far; next() reports those since its
        last report as one BatchError, after any good batch that is ready."""
        if not self._handle:
            raise RuntimeError(f"receiver for {self.endpoint} is closed")
        return int(self._lib.fb_receiver_bad(self._handle))

    def _stats(self) -> tuple[list[tuple[int, ...]], tuple[int, int]]:
        if not self._handle:
            raise RuntimeError(f"receiver for {self.endpoint} is closed")
        cap = 64
        while True:
            rows = (ctypes.c_int64 * (5 * cap))()
            totals = (ctypes.c_int64 * 2)()
            n = self._lib.fb_receiver_stats(self._handle, rows, cap, totals)
            if n <= cap:
                return [tuple(rows[5 * r : 5 * r + 5]) for r in range(n)], (totals[0], totals[1])
            cap = n

    def close(self) -> None:
        """Stop the threads and close the socket; slots are no longer written.

        Zero-copy arrays still alive keep their batches (and the regions under
        them) valid: the rest is freed when the last of them is dropped.
        """
        handle = self._handle
        if not handle or self._closed:
            return
        self._lib.fb_receiver_stop(handle)  # wakes a next() waiting in another thread
        self._closed = True
        if self._outstanding == 0:
            self._free()

    def _free(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
            if handle:
                self._lib.fb_receiver_close(handle)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self.close()
