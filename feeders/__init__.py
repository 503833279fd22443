"""What puts a received batch on each device, per framework.

`feeders.tf`: a StagingArea per tower (tensorpack's StagingInput), so step k
trains on the batch copied during step k-1. `feeders.device_copy`: every
PyTorch copy to the device, from pinned host memory on a side CUDA stream
(`to_device`, `SideCopy`, `CopySources`), with the note on why it is made so.
`feeders.torch`: `Prefetcher`, a thread filling a pinned ring ahead of the
step. `feeders.cuda_slots`: shm:// slots registered with CUDA, so a batch is
copied to the GPU straight from the producer's slot. This package itself
imports neither framework.
"""
