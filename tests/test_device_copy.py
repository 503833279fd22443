"""The one device copy (feeders/device_copy.py): host memory held until its copy is done, and on a GPU the
side-stream copy's three rules: the step's stream waits for the copy, the copy's memory is not reused while the
step still reads it, and a host buffer is not refilled before the copy out of it is done."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from feeders.device_copy import CopySources, SideCopy  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the side stream is CUDA's")
SLEEP = 200_000_000  # GPU cycles (about 0.1 s): the stream it is queued on stays busy meanwhile


class Event:
    """A stand-in for the CUDA event recorded after a copy: passed once `passed` is set; `synchronize` waits."""

    def __init__(self) -> None:
        self.passed = False
        self.waited = False

    def query(self) -> bool:
        return self.passed

    def synchronize(self) -> None:
        self.waited = self.passed = True


def test_sources_are_let_go_oldest_first_and_only_once_their_copy_is_done():
    released: list[int] = []
    held = CopySources(release=released.append)
    events = [Event() for _ in range(3)]
    for i, e in enumerate(events):
        held.add(i, e)
    events[1].passed = True
    held.settle()
    assert released == []  # the oldest copy is still running: nothing after it goes first
    events[0].passed = True
    held.settle()
    assert released == [0, 1] and len(held) == 1 and not events[2].waited
    held.drain()
    assert events[2].waited and released == [0, 1, 2] and len(held) == 0


def test_a_ring_of_four_waits_only_for_the_copy_out_of_the_buffer_it_refills():
    held = CopySources()
    events = [Event() for _ in range(4)]
    for i, e in enumerate(events):
        held.add(i, e)
    held.keep_at_most(3)  # buffer 0 is refilled next: its copy, and only it, is waited for
    assert [e.waited for e in events] == [True, False, False, False] and len(held) == 3


def test_without_a_gpu_the_host_tensors_are_the_steps_input_and_go_at_the_next_settle():
    copier = SideCopy(torch.device("cpu"))
    host = [torch.arange(6, dtype=torch.int32), torch.zeros(2)]
    pending = copier.start(host)
    assert pending.done is None and copier.stream is None
    out = copier.hand_over(pending)
    assert [t.data_ptr() for t in out] == [t.data_ptr() for t in host]  # no copy at all
    released: list[str] = []
    held = CopySources(release=released.append)
    held.add("slot", pending.done)
    held.settle()
    assert released == ["slot"]


@gpu
def test_the_steps_stream_waits_for_a_copy_queued_behind_other_work_on_the_side_stream():
    device = torch.device("cuda", 0)
    copier = SideCopy(device)
    host = torch.randint(0, 256, (1 << 22,), dtype=torch.uint8).pin_memory()
    with torch.cuda.stream(copier.stream):
        torch.cuda._sleep(SLEEP)  # the copy lands only after this
    out = copier.copy([host])[0]
    assert torch.equal(out.cpu(), host)  # read on the step's stream: without its wait, before the copy landed


@gpu
def test_the_copys_memory_is_not_reused_while_the_steps_stream_still_reads_it():
    device = torch.device("cuda", 0)
    copier = SideCopy(device)
    n = 1 << 22
    first = copier.copy([torch.ones(n, dtype=torch.uint8).pin_memory()])[0]
    # Everything that may wait for the whole device happens before the sleep: allocating pinned memory
    # (cudaHostAlloc), and loading the sum's kernel at its first launch (CUDA loads modules lazily). Either,
    # after the sleep, lets the step's stream read `first` before it is freed, and reusing its memory is then
    # safe: the H200 run of 2026-11-28 saw the same address come back with only the pinning moved.
    next_batch = torch.full((n,), 2, dtype=torch.uint8).pin_memory()
    first.sum().item()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP)  # the step's stream is busy; the read of `first` is queued behind it
    total = first.sum()
    where = first.data_ptr()
    del first  # freed while the step's stream has not read it yet
    second = copier.start([next_batch]).tensors[0]
    assert second.data_ptr() != where  # were the step's stream not recorded on it, the side stream would reuse it
    assert total.item() == n  # and its copy would have overwritten what the step then read


@gpu
def test_a_pinned_buffer_is_refilled_only_once_the_copy_out_of_it_is_done():
    device = torch.device("cuda", 0)
    copier = SideCopy(device)
    buffer = torch.full((1 << 22,), 7, dtype=torch.uint8).pin_memory()
    held = CopySources()
    with torch.cuda.stream(copier.stream):
        torch.cuda._sleep(SLEEP)  # the copy out of the buffer starts only after this
    pending = copier.start([buffer])
    held.add(0, pending.done)
    held.keep_at_most(0)  # as a ring does before it refills buffer 0
    buffer.fill_(9)
    out = copier.hand_over(pending)[0]
    assert bool((out == 7).all())  # the batch that was copied, not the next one written over it
