"""Host-to-device copy bandwidth, pinned and pageable: the ceiling of every path that copies batches to a GPU.

`python -m harness.torch.bandwidth [--mb 1,39,256] [--repeats 7]` prints a table of GB/s (median of the
repeats) for each copy size: small copies pay the launch and the DMA set-up, a batch of 256 at 224x224 is
38.5 MB. Without a GPU it measures a host-to-host tensor copy instead, and says so; where the driver reports GPUs that torch
cannot see (a driver older than torch's CUDA), it names the driver and the fix in one line and exits 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from core.cli_types import positive_int


def copy_gbps(nbytes: int, pinned: bool, repeats: int = 7, device: torch.device | None = None) -> float:
    """Median GB/s of copying `nbytes` from host memory (pinned or not) to `device` (the GPU, else the CPU)."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned and cuda).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=pinned)  # first touch and warm-up
    if cuda:
        torch.cuda.synchronize(device)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=pinned)
        if cuda:
            torch.cuda.synchronize(device)
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def sizes_mb(text: str) -> list[int]:
    """`--mb`'s comma-separated copy sizes, each a positive whole number of MB."""
    try:
        sizes = [positive_int(x.strip()) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"--mb {text!r}: {e}") from None
    if not sizes:
        raise argparse.ArgumentTypeError("--mb: no size given")
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.torch.bandwidth", description=__doc__)
    p.add_argument("--mb", type=sizes_mb, default=[256], help="bytes per copy, in MB; several: 1,39,256")
    p.add_argument("--repeats", type=positive_int, default=7)
    a = p.parse_args(argv)
    from harness.torch.gpu_visibility import unseen_gpu_problem

    problem = unseen_gpu_problem(torch)
    if problem:  # not "no GPU here": the machine has GPUs this torch cannot use
        print(f"error: {problem}", file=sys.stderr)
        return 1
    cuda = torch.cuda.is_available()
    if cuda:
        print(f"host -> {torch.cuda.get_device_name(0)}, median of {a.repeats} copies (GB/s)")
        print(f"{'MB':>6}  {'pinned':>7}  {'pageable':>8}")
    else:
        print(f"no GPU: host -> host tensor copy, median of {a.repeats} copies (GB/s)")
        print(f"{'MB':>6}  {'copy':>7}")
    for mb in a.mb:
        n = mb * 1_000_000
        if cuda:
            print(f"{mb:>6}  {copy_gbps(n, True, a.repeats):>7.1f}  {copy_gbps(n, False, a.repeats):>8.1f}", flush=True)
        else:
            print(f"{mb:>6}  {copy_gbps(n, False, a.repeats):>7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
