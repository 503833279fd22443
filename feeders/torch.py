"""PyTorch's feeder: from a host-side source of batches to the device, through pinned memory and a side stream.

A thread takes each batch (numpy arrays) from the source, copies it into one
of a ring of page-locked host buffers, and starts its asynchronous
host-to-device copy on a side CUDA stream (feeders/device_copy.py, which says
why each step of the copy is there); the training step waits only on that
copy's event, so the copy overlaps the previous step's compute. Without a GPU
the ring buffers are ordinary host memory and are handed to the step as they
are (no pinning, no streams: there is no device to copy to).

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

from feeders.device_copy import CopySources, Pending, SideCopy
from frameworks.torch_trace import stage

_END = object()


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
        # Ring of host buffers: `depth` queued, one being filled, one the step may still read (CPU device);
        # on a GPU a buffer is refilled only once the copy out of it is done (`_copying`).
        self._ring: list[list[torch.Tensor] | None] = [None] * (depth + 2)
        self._copying = CopySources()
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.copier = SideCopy(device)
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
                self._copying.keep_at_most(len(self._ring) - 1)  # the last copy out of buffer i is done
                with stage("feedbench.host_copy"):
                    host = self._host_slot(i, arrays)
                    for t, a in zip(host, arrays):
                        t.copy_(as_tensor(a))
                item = self.copier.start(host)  # on a GPU: the copy queued on the side stream
                self._copying.add(i, item.done)
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
        tensors = self.copier.hand_over(item)
        self.batches += 1
        return tensors

    def _take(self, t0: float) -> Pending | object:
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
