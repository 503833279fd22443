"""CUDA registration of shared-memory slots: a batch goes from a producer's slot to the GPU by DMA.

The native receiver (zmq_ops/receiver.py) maps each shm:// region and calls
a hook as it does; the hook made here page-locks the region with CUDA, so a
zero-copy batch is copied to the device straight from the producer's slot,
with no copy on the host. TensorFlow's op registers its regions in C++
(zmq_ops/src/zmq_connection.cc); `zmq_ops.tf_op.cuda_regions` reports them.
"""

from __future__ import annotations

from typing import Any


def cuda_host_register(cudart: Any = None, device: int | None = None) -> Any:
    """An `on_region` callback that registers each shm:// region with CUDA, and unregisters it before it is unmapped.

    Registered (page-locked) host memory is what a GPU copies from by DMA, so
    with zero-copy arrays over the slots a batch goes from the producer's slot
    to the device with no CPU copy at all. `cudart` is torch's CUDA runtime
    binding (default: ``torch.cuda.cudart()``), or anything with
    cudaHostRegister(ptr, size, flags) / cudaHostUnregister(ptr) returning 0 on
    success (and cudaSetDevice(device), when `device` is given).

    `device`: the GPU to make current on the calling thread first. The hook
    runs on the native receive threads, whose current device is 0 until set
    (the CUDA runtime keeps it per host thread): without it every rank would
    open a context on GPU 0. A region that cannot be registered is still
    mapped; the caller must not count its copies as DMA from registered memory:
    ``report()`` says how many regions were registered and refused (the error
    codes in ``errors``).
    """
    if cudart is None:
        import torch  # only when asked for: the tests and other runtimes give their own binding

        cudart = torch.cuda.cudart()
        select = torch.cuda.set_device  # cudaSetDevice on the calling thread
    else:
        select = cudart.cudaSetDevice if device is not None else None

    def on_region(base: int, size: int, mapped: bool) -> None:
        if device is not None:
            select(device)
        if mapped:
            err = int(getattr(code := cudart.cudaHostRegister(base, size, 0), "value", code))
            if err == 0:
                on_region.registered[base] = size
                on_region.count += 1
            else:
                on_region.failures += 1
                on_region.errors.append(err)
        elif on_region.registered.pop(base, None) is not None:
            cudart.cudaHostUnregister(base)

    def report() -> dict[str, int]:
        return {"registered": on_region.count, "refused": on_region.failures}

    on_region.registered = {}
    on_region.count = 0  # regions ever registered
    on_region.failures = 0
    on_region.errors = []
    on_region.report = report
    return on_region
