"""shm:// regions registered with CUDA from the receive threads: on the rank's GPU, and refusals reported.

There is no GPU here: a stand-in for torch.cuda.cudart() keeps what the CUDA
runtime keeps per host thread (the current device, 0 until set) and can
refuse cudaHostRegister as a real one does (e.g. memory locking limits), while
real producer processes fill real shm:// slots that real receive threads map.
"""

from __future__ import annotations

import threading

import pytest

from feeders.cuda_slots import cuda_host_register
from tests.test_shm_zero_copy import SPECS, TIMEOUT_MS, check, tagged
from zmq_ops.receiver import Receiver

CUDA_ERROR_INVALID_VALUE = 1


class ThreadedCudart:
    """CUDA runtime calls as the runtime sees them: the current device is per host thread, 0 until set."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self._current = threading.local()
        self.registered_on: list[tuple[int, int]] = []  # (host thread, device current when registering)
        self.unregistered = 0

    def cudaSetDevice(self, device: int) -> int:  # noqa: N802 (CUDA's spelling)
        self._current.device = device
        return 0

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
        self.registered_on.append((threading.get_ident(), getattr(self._current, "device", 0)))
        return CUDA_ERROR_INVALID_VALUE if self.refuse else 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.unregistered += 1
        return 0


def receive(ep: str, procs, hook, batches: int = 10) -> None:
    """Two producers' batches through a zero-copy receiver that calls `hook` for each region."""
    with Receiver(ep, SPECS, 4, timeout_ms=TIMEOUT_MS, zero_copy=True, on_region=hook) as r:
        ps = [tagged(procs, ep, p, batches // 2) for p in range(2)]
        for _ in range(batches):
            check(*r.next_arrays())
    for p in ps:
        p.terminate()
        p.wait(60)


@pytest.mark.timeout(120)
def test_regions_are_registered_on_the_ranks_gpu_from_the_receive_threads(procs, ep) -> None:
    """Without cudaSetDevice on each receive thread, every rank would open a context on GPU 0."""
    cudart = ThreadedCudart()
    hook = cuda_host_register(cudart, device=3)
    receive(ep, procs, hook)
    assert len(cudart.registered_on) == 2  # one region per producer
    assert {device for _, device in cudart.registered_on} == {3}
    assert threading.get_ident() not in {t for t, _ in cudart.registered_on}  # the native threads, not ours
    assert hook.report() == {"registered": 2, "refused": 0}
    assert cudart.unregistered == 2


@pytest.mark.timeout(120)
def test_regions_cuda_refuses_are_counted_and_never_unregistered(procs, ep) -> None:
    """A refused region is still read (pageable): the report says so, so no result may claim DMA from it."""
    cudart = ThreadedCudart(refuse=True)
    hook = cuda_host_register(cudart, device=1)
    receive(ep, procs, hook)
    assert hook.report() == {"registered": 0, "refused": 2}
    assert hook.errors == [CUDA_ERROR_INVALID_VALUE] * 2
    assert cudart.unregistered == 0
