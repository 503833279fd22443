"""What puts a received batch on each device, per framework.

`feeders.tf`: a StagingArea per tower (tensorpack's StagingInput), so step k
trains on the batch copied during step k-1. `feeders.torch`: pinned host
memory and a side CUDA stream (`Prefetcher`, `SideCopy`, `to_device`, the one
door every PyTorch copy to the device goes through). `feeders.cuda_slots`:
shm:// slots registered with CUDA, so a batch is copied to the GPU straight
from the producer's slot. This package itself imports neither framework.
"""
