"""How much memory a run needs, estimated before it starts, so a run that cannot fit is refused with the figure.

Without this, `--batch 100000` starts every rank, which then allocate until
the kernel's out-of-memory killer stops one (and often something else of the
user's with it). The estimate is deliberately on the low side: it refuses
only what surely cannot fit, and says how much it thinks is needed.

Where the figures come from (measured with PyTorch 2.14 on CPU, torchvision's
ResNet-50, channels-last, SGD with momentum):

- training ResNet-50 keeps about 1,720 bytes per input pixel saved for the
  backward pass (the sum of the tensors autograd saves, counted with
  `torch.autograd.graph.saved_tensors_hooks`, the same at 64, 96 and 224
  pixels); the peak resident memory of a step grows by 2,480 to 2,660 bytes
  per pixel (batch 2 -> 16 at 64x64, 64x64 -> 128x128 at batch 16: the saved
  tensors plus the gradients being computed). `ACT_BYTES_PER_PIXEL` takes
  2,500 for host memory; on a GPU, where cuDNN's backward may need less
  scratch than the CPU's, only what autograd must keep is counted
  (`SAVED_BYTES_PER_PIXEL`, 1,700), so a batch that might just fit is not
  refused. Half precision stores activations in 2 bytes where float32 takes
  4, hence about half of each.
- a CPU rank with the model, its gradients and the optimizer's momentum
  (3 x 102 MB) and PyTorch itself resides in about 1.1 GB before its first
  batch, of which the libraries' pages are shared between ranks; `RANK_BYTES`
  counts 0.8 GB per rank. A GPU rank holds about 1 GB on its device (the same
  model states, DDP's gradient buckets and the CUDA context).
- the stand-in models (`--input-only`, `--model emulated`) keep only the
  normalised float copies of the batch: 4 x 12 bytes per pixel.
- the input side holds about `INPUT_BATCHES` batches per rank (feeder rings,
  queues, ZMQ high-water marks on both sides), as the TensorFlow trainer's
  check assumes.

`python -m runner.memory --batch B --image-size S [--ranks N]` prints the
estimate.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

GB = 1e9
ACT_BYTES_PER_PIXEL = 2_500  # ResNet-50 training, float32 (measured: see above)
HALF_ACT_BYTES_PER_PIXEL = 1_250  # the same with float16/bfloat16 autocast
SAVED_BYTES_PER_PIXEL = 1_700  # what autograd keeps for the backward pass: the floor on a GPU
STAND_IN_BYTES_PER_PIXEL = 48  # --input-only / emulated: the float copies normalize makes
RANK_BYTES = 0.8 * GB  # a CPU rank before its first batch: PyTorch, the model, its gradients, momentum
DEVICE_RANK_BYTES = 1.0 * GB  # the same on a GPU (CUDA context instead of the host runtime)
HOST_RANK_BYTES = 0.8 * GB  # a GPU rank's host side: PyTorch and CUDA's libraries
INPUT_BATCHES = 16  # batches an input path keeps per rank: rings, queues, both sides' high-water marks


@dataclass
class Estimate:
    """Bytes a run needs: in host memory (all ranks of this machine), and on each GPU (0 without GPUs)."""

    host: float
    per_device: float
    activations: float  # per rank: what grows with batch x pixels
    batch_bytes: float


def estimate(
    batch: int,
    image_size: int,
    ranks: int,
    gpus: int,
    *,
    stand_in: bool = False,
    half: bool = False,
    producers: int = 0,
    producer_workers: int = 1,
    hwm: int = 4,
) -> Estimate:
    """The memory `ranks` ranks of this machine need for one batch size (per device) and image size."""
    pixels = batch * image_size * image_size
    per_pixel = STAND_IN_BYTES_PER_PIXEL if stand_in else HALF_ACT_BYTES_PER_PIXEL if half else ACT_BYTES_PER_PIXEL
    activations = float(pixels * per_pixel)
    batch_bytes = float(batch * (image_size * image_size * 3 + 4))
    inputs = INPUT_BATCHES * batch_bytes
    # Each producer worker keeps a pool of batches and its socket's high-water mark.
    producing = producers * producer_workers * (hwm + 2) * batch_bytes
    if gpus:
        host = ranks * (HOST_RANK_BYTES + inputs) + producing
        saved = STAND_IN_BYTES_PER_PIXEL if stand_in else SAVED_BYTES_PER_PIXEL // (2 if half else 1)
        activations = float(pixels * saved)
        per_device = DEVICE_RANK_BYTES + activations
    else:
        host = ranks * (RANK_BYTES + activations + inputs) + producing
        per_device = 0.0
    return Estimate(host, per_device, activations, batch_bytes)


def check(est: Estimate, available: float, device_memory: float | None, what: str, ranks: int) -> str | None:
    """None when the run fits; else one line with what it needs and what there is (`what`: the flags at fault).

    `device_memory` is the smallest GPU's memory (None without GPUs); `available` the host's available memory.
    """
    act = f"activations {est.activations / GB:,.1f} GB per rank"
    if device_memory is not None and est.per_device > device_memory:
        return (
            f"{what}: each rank needs about {est.per_device / GB:,.1f} GB on its GPU ({act}), and the GPU has "
            f"{device_memory / GB:,.1f} GB; lower --batch or --image-size"
        )
    if est.host > available:
        return (
            f"{what}: {ranks} rank(s) need about {est.host / GB:,.1f} GB of memory"
            f"{'' if device_memory is not None else f' ({act})'}, and this machine has {available / GB:,.1f} GB "
            "available; lower --batch or --image-size"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runner.memory", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--image-size", type=int, required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--input-only", action="store_true")
    p.add_argument("--half", action="store_true")
    a = p.parse_args(argv)
    est = estimate(a.batch, a.image_size, a.ranks, a.gpus, stand_in=a.input_only, half=a.half)
    print(f"host: {est.host / GB:,.2f} GB for {a.ranks} rank(s)")
    if a.gpus:
        print(f"each GPU: {est.per_device / GB:,.2f} GB")
    print(f"activations per rank: {est.activations / GB:,.2f} GB; one batch: {est.batch_bytes / 1e6:,.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
