"""PyTorch's feeder: from a host-side source of batches to the device, through pinned memory and a side stream.

A thread takes each batch (numpy arrays) from the source, copies it into one
of a ring of page-locked host buffers, and starts an asynchronous
host-to-device copy on a side CUDA stream; the training step waits only on
that copy's event, so the copy overlaps the previous step's compute. Without
a GPU the ring buffers are ordinary host memory and are handed to the step
as they are (no pinning, no streams: there is no device to copy to).

The time the step spends in `next()` is its input wait: the batch was not
ready yet.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from frameworks.torch_trace import stage

_END = object()


class PageableCopy(RuntimeError):
    """A host-to-device copy whose source is not in pinned memory (CUDA would stage it and block the host)."""


def to_device(host: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Non-blocking copies of pinned host tensors to `device`: every path's host-to-device copy goes through here.

    A `non_blocking` copy from pageable memory is silently a synchronous,
    staged one, and `torch.cuda.set_sync_debug_mode` does not flag it: so the
    source is checked here (`is_pinned()`), and a pageable one is refused
    naming its shape, instead of making the path look slower than it is.
    """
    for t in host:
        if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
            raise PageableCopy(
                f"host->device copy of a {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} tensor from "
                "pageable memory: every copy to the device must come from pinned memory"
            )
    with stage("feedbench.copy_to_device"):
        return [t.to(device, non_blocking=True) for t in host]


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor viewing `a` (no copy), also when `a` is read-only (a view of a receive buffer we never write)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(a))


class Prefetcher:
    """Runs `source` on a thread, `depth` batches ahead; `next()` gives (images, labels) on `device`.

    `source` is an iterator factory called on the thread, so a socket it opens
    belongs to that thread.
    """

    def __init__(
        self,
        source: Callable[[], Iterator[Sequence[np.ndarray]]],
        device: torch.device,
        depth: int = 2,
        timeout: float | None = None,
        name: str = "prefetch",
        check: Callable[[], None] | None = None,
        source_stage: str = "feedbench.source",
    ) -> None:
        self.device = device
        self.source_stage = source_stage  # its range in a --profile trace (harness/torch/tracing.py)
        self.check = check  # called while the step waits: raises if the source can no longer deliver
        self.cuda = device.type == "cuda"
        self.depth = depth
        self.timeout = timeout
        # Ring of host buffers: `depth` queued, one being filled, one the step may still read (CPU device).
        self._ring: list[list[torch.Tensor] | None] = [None] * (depth + 2)
        self._ring_events: list[torch.cuda.Event | None] = [None] * (depth + 2)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.batches = 0  # handed to the step
        self.queue_sizes: list[int] = []  # occupancy seen by each next(), for telemetry
        self._source = source
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- the feeding thread ----------------------------------------------------------------
    def _host_slot(self, i: int, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        slot = self._ring[i]
        if slot is None or [tuple(t.shape) for t in slot] != [a.shape for a in arrays]:
            slot = [
                torch.empty(a.shape, dtype=as_tensor(a[:0]).dtype, pin_memory=self.cuda) for a in arrays
            ]  # fmt: skip
            self._ring[i] = slot
        return slot

    def _run(self) -> None:
        try:
            if self.cuda:
                torch.cuda.set_device(self.device)
            k = 0
            source = iter(self._source())
            while True:
                with stage(self.source_stage):
                    arrays = next(source, _END)
                if arrays is _END or self._stop.is_set():
                    return
                i = k % len(self._ring)
                if self.cuda and self._ring_events[i] is not None:
                    self._ring_events[i].synchronize()  # the last copy out of this buffer is done
                with stage("feedbench.host_copy"):
                    host = self._host_slot(i, arrays)
                    for t, a in zip(host, arrays):
                        t.copy_(as_tensor(a))
                if self.cuda:
                    with torch.cuda.stream(self.stream):
                        out = to_device(host, self.device)
                        ev = torch.cuda.Event()
                        ev.record(self.stream)
                    self._ring_events[i] = ev
                    item = (out, ev)
                else:
                    item = (host, None)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                k += 1
        except BaseException as e:  # handed to the step, which reports it
            self._error = e
        finally:
            try:
                self._queue.put(_END, timeout=1.0)
            except queue.Full:
                pass

    # --- the training step -----------------------------------------------------------------
    def next(self) -> list[torch.Tensor]:
        """The next batch on the device, ready for the current stream to use."""
        self.queue_sizes.append(self._queue.qsize())
        t0 = time.perf_counter()
        with stage("feedbench.wait"):
            item = self._take(t0)
        if item is _END:
            if self._error is not None:
                raise self._error
            raise RuntimeError("the input ended")
        tensors, ev = item
        if ev is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ev)
            for t in tensors:
                t.record_stream(current)  # allocated on the side stream, used on this one
        self.batches += 1
        return tensors

    def _take(self, t0: float):
        while True:
            try:
                return self._queue.get(timeout=0.5)
            except queue.Empty:
                if self.check is not None:
                    self.check()  # a producer that died: say so now, not after the receive timeout
                if self._error is not None or not self._thread.is_alive():
                    return _END
                if self.timeout is not None and time.perf_counter() - t0 > self.timeout:
                    raise TimeoutError(f"no batch within {self.timeout:g} s") from None

    def stopped(self) -> bool:
        """True once `close` has been called: a source polls this between receives."""
        return self._stop.is_set()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=5.0)


class SideCopy:
    """Copies host tensors already in pinned memory to the device on a side stream, and hands them to the step.

    `copy` queues the copy on the side stream and makes the step's stream wait
    for it (on the device: the host does not wait), marking the tensors as used
    there, so the caching allocator keeps them until the step's work is done.
    The pinned source may be dropped once `copy` has returned: PyTorch's
    pinned-memory allocator holds the block until the copy is done.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def copy(self, host: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        with torch.cuda.stream(self.stream):
            out = to_device(host, self.device)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        current = torch.cuda.current_stream(self.device)
        current.wait_event(ev)
        for t in out:
            t.record_stream(current)
        return out
