"""The copy of a batch to the device, for every PyTorch path: from pinned memory, on a side stream.

Why it is done this way (the one note on it; the paths point here)
-------------------------------------------------------------------
1. **Pinned sources only** (`to_device`). A `non_blocking` copy from pageable
   memory is silently a synchronous, staged one (the host waits), and
   `torch.cuda.set_sync_debug_mode` does not flag it: a pageable source is
   refused, naming its shape.
2. **A side stream** (`SideCopy.start`). The copy is queued on a stream of its
   own, so the device runs it while the step's stream is still running the
   previous step, instead of queueing it behind that step.
3. **An event, not a host wait** (`SideCopy.hand_over`). An event is recorded
   on the side stream after the copy, and the step's stream waits for it
   (`wait_event`: on the device; the host goes on queueing the step). Every
   kernel the step queues after that sees the whole batch. The event is
   recorded before the batch is handed over, on whatever thread copied it (a
   wait on an event not recorded yet would be no wait at all), and the wait
   is made on the current stream of the thread that hands it over, the one
   the step queues its work on.
4. **`record_stream` on the step's stream** (`SideCopy.hand_over`). The
   device tensors were allocated while the side stream was current, so the
   caching allocator ties their memory to the side stream alone: once the
   step drops them, the next copy on the side stream could be given the same
   memory while the step's stream is still reading it, a silent corruption
   no CPU test sees. `record_stream` makes the allocator wait, when the
   tensor is freed, for the work then queued on the step's stream. (The
   other way, the side stream waiting for the step's stream before each copy,
   would serialise the copy behind the step it is meant to overlap.) The side
   stream itself never waits for the step's: what its copy writes is memory
   the allocator handed out only under this rule, and what it reads is host
   memory written by the host before the copy was queued.
5. **Host memory held until its copy is done** (`CopySources`). The copy
   reads its host buffer later, when the side stream gets to it: a buffer
   written again before the copy's event has passed (a ring buffer refilled,
   a receiver slot given back to the native receive threads, a producer's
   shm:// slot given back) would send the new bytes, or a mix. A tensor made
   by `pin_memory()` and then dropped needs no holding: PyTorch's pinned
   memory allocator records the copy's event and keeps the block until it
   has passed; that covers neither a buffer a path reuses itself nor memory
   page-locked with cudaHostRegister (feeders/cuda_slots.py).

Work other than a copy that runs on the side stream (gpu-decode's decode) is
handed over the same way (`SideCopy.on_stream`, `SideCopy.mark`). Without a
GPU there is nothing to copy: the host tensors are the step's input as they
are, and every event is None.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from frameworks.torch_trace import stage


class PageableCopy(RuntimeError):
    """A host-to-device copy whose source is not in pinned memory (CUDA would stage it and block the host)."""


def to_device(host: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Non-blocking copies of pinned host tensors to `device`, on the current stream: every copy goes through here.

    A pageable source is refused (point 1 of this module's note) rather than
    making the path look slower than it is.
    """
    for t in host:
        if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
            raise PageableCopy(
                f"host->device copy of a {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} tensor from "
                "pageable memory: every copy to the device must come from pinned memory"
            )
    with stage("feedbench.copy_to_device"):
        return [t.to(device, non_blocking=True) for t in host]


class Pending(NamedTuple):
    """Tensors whose copy (or other side-stream work) is queued; `done` is the event recorded after it."""

    tensors: list[torch.Tensor]
    done: torch.cuda.Event | None  # None: nothing queued (no GPU), the tensors are ready


class SideCopy:
    """Copies pinned host tensors to the device on a side stream, and hands them to the step's stream.

    `copy` does both at once; `start` (on any thread) and `hand_over` (on the
    step's thread) split them, so a batch's copy can be started ahead of the
    step that uses it. Why each call is there: this module's note.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def on_stream(self) -> contextlib.AbstractContextManager:
        """Work queued inside runs on the side stream (nothing changes without a GPU); end it with `mark`."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def mark(self, tensors: Sequence[torch.Tensor]) -> Pending:
        """`tensors`, made by the work queued on the side stream so far, with the event that follows that work."""
        if self.stream is None:
            return Pending(list(tensors), None)
        done = torch.cuda.Event()
        done.record(self.stream)
        return Pending(list(tensors), done)

    def start(self, host: Sequence[torch.Tensor]) -> Pending:
        """Queue the copy of `host` (pinned) on the side stream; without a GPU, `host` itself."""
        if self.stream is None:
            return Pending(list(host), None)
        with self.on_stream():
            out = to_device(host, self.device)
        return self.mark(out)

    def hand_over(self, pending: Pending) -> list[torch.Tensor]:
        """The tensors, ready for the calling thread's current stream (the step's): the one place that syncs them."""
        if pending.done is None:
            return pending.tensors
        current = torch.cuda.current_stream(self.device)
        current.wait_event(pending.done)  # on the device: the host does not wait
        for t in pending.tensors:
            t.record_stream(current)  # allocated on the side stream, used on this one
        return pending.tensors

    def copy(self, host: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """`host` (pinned) on the device, ready for the current stream; the source may be dropped once this returns."""
        return self.hand_over(self.start(host))


class CopySources:
    """Host memory copies to the device may still be reading, oldest first, each with its copy's event.

    Each is let go (`release(source)`: back to a receiver, or only dropped)
    once its event has passed (point 5 of this module's note). Events of one
    stream pass in the order they were recorded, so the oldest goes first. A
    source added with no event (no GPU) goes at the next `settle`.
    """

    def __init__(self, release: Callable[[Any], None] | None = None) -> None:
        self._held: deque[tuple[Any, Any]] = deque()
        self._release = release

    def __len__(self) -> int:
        return len(self._held)

    def add(self, source: Any, done: torch.cuda.Event | None) -> None:
        """Hold `source` until `done` (recorded after the copy that reads it) has passed."""
        self._held.append((source, done))

    def settle(self) -> None:
        """Let go of every source whose copy is done, without waiting."""
        while self._held and (self._held[0][1] is None or self._held[0][1].query()):
            self._let_go()

    def keep_at_most(self, n: int) -> None:
        """Wait for the oldest copies until at most `n` sources are held (a ring of n + 1: the next one is free)."""
        while len(self._held) > n:
            done = self._held[0][1]
            if done is not None:
                done.synchronize()
            self._let_go()

    def drain(self) -> None:
        """Wait for every copy, and let go of every source (before the memory itself is freed or unmapped)."""
        self.keep_at_most(0)

    def _let_go(self) -> None:
        source, _ = self._held.popleft()
        if self._release is not None:
            self._release(source)
