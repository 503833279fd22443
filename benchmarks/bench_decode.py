"""`python -m benchmarks bench-decode`: images/s per core of the Python decode producer and of DALI on CPU.

Both run in this process on the same files, with the same output size and
the same augmentation (random-resized crop, random flip), one core each: one
Python worker, and a DALI pipeline with num_threads=1. No wire is involved:
this measures the sources themselves (read + decode + crop + resize + batch).

"Per core" is images per CPU-second of this process (all its threads), so
the figure holds on a busy machine too; wall-clock images/s is printed
beside it and matches on an idle one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np
from tabulate import tabulate

from core.cli_types import positive_int
from producers.decode import DECODERS, DEFAULT_DECODER, DatasetError, DecodeSource, list_images
from profiler.summary import Summary


def measure(next_batch: Callable[[], tuple[np.ndarray, np.ndarray]], batches: int, warmup: int, repeats: int) -> dict:
    """Images per CPU-second and per wall-second over `repeats` windows of `batches` batches."""
    for _ in range(warmup):
        next_batch()
    cpu, wall = [], []
    for _ in range(repeats):
        images = 0
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(batches):
            images += len(next_batch()[0])
        cpu.append(images / max(time.process_time() - c0, 1e-9))
        wall.append(images / (time.perf_counter() - w0))
    return {"per_core": Summary.of(cpu), "wall": Summary.of(wall)}


def python_batches(args: argparse.Namespace, decoder: str) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    # No Pillow fallback here: a stack that failed would be timed as Pillow.
    source = DecodeSource(args.data, args.list, args.batch, args.image_size, decoder=decoder, fallback=False)
    it: Iterator = source(0)
    return lambda: next(it)


def dali_batches(args: argparse.Namespace) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    from producers.dali_source import build_pipeline, host_batch

    files, labels, _ = list_images(args.data, args.list)
    pipe = build_pipeline(args.data, files, labels, args.batch, args.image_size, "cpu", num_threads=1)
    return lambda: host_batch(pipe)


def run(args: argparse.Namespace) -> int:
    try:
        files, _, classes = list_images(args.data, args.list)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    candidates = [("python decode", d, lambda d=d: python_batches(args, d)) for d in args.decoders]
    if not args.no_dali:
        candidates.append(("DALI cpu", "nvidia.dali (num_threads=1)", lambda: dali_batches(args)))
    results = {}
    for producer, stack, make in candidates:
        try:
            next_batch = make()
        except ImportError as e:
            print(f"note: {producer} skipped: {e}", file=sys.stderr)
            continue
        r = measure(next_batch, args.batches, args.warmup, args.repeats)
        results[(producer, stack)] = r
        rows.append([producer, stack, r["per_core"].fmt(".0f"), r["wall"].fmt(".0f")])
        print(f"  {producer} / {stack}: {r['per_core'].median:.0f} images/s per core", file=sys.stderr, flush=True)
    dali = next((r for (p, _), r in results.items() if p == "DALI cpu"), None)
    if dali is not None:
        for row, r in zip(rows, results.values(), strict=True):
            row.append(f"{r['per_core'].median / dali['per_core'].median:.2f}")
    print(
        f"\nDecode: {len(files)} JPEGs in {len(classes)} classes under {args.data} -> "
        f"{args.batch}x{args.image_size}x{args.image_size}x3 uint8, random-resized crop + flip, one core each;\n"
        f"median (min–max) of {args.repeats} repeats of {args.batches} batches, after {args.warmup} warm-up batches\n"
    )
    headers = ["producer", "stack", "images/s per core", "images/s wall"]
    if dali is not None:
        headers.append("ratio to DALI cpu")
    print(tabulate(rows, headers=headers))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-decode", help="benchmark decoding: Python decode producer vs DALI on CPU, per core")
    p.add_argument("--data", required=True, metavar="DIR", help="ImageNet-layout folder (see make-dataset)")
    p.add_argument("--list", metavar="FILE", help="use only these files: lines of 'relative/path [label]'")
    p.add_argument("--image-size", type=positive_int, default=224, help="output height and width")
    p.add_argument("--batch", type=positive_int, default=32, help="images per batch")
    p.add_argument("--batches", type=positive_int, default=10, help="batches per timed repeat")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats; the median is reported")
    p.add_argument("--warmup", type=positive_int, default=3, help="batches before timing starts")
    p.add_argument(
        "--decoders",
        nargs="+",
        choices=sorted(DECODERS),
        default=[DEFAULT_DECODER],
        help="Python decoding stacks to measure (default: the producer's own)",
    )
    p.add_argument("--no-dali", action="store_true", help="measure the Python producer only")
    p.set_defaults(func=run)
