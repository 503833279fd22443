"""`python -m benchmarks bench-decode`: images/s per core of the decode producer, and of DALI on the CPU.

Every row does the same work on the same files: read, decode, an
Inception-style random-resized crop (area 8-100 %, aspect 3/4-4/3), a random
flip, resize to --image-size, batch.

- "in process": the decode producer's source (`producers.decode.DecodeSource`)
  in this process, one thread, per decoding stack (the ROI decoder first);
- DALI cpu: `fn.decoders.image` + `fn.random_resized_crop` (full decode), and
  its ROI decoder `fn.decoders.image_random_crop` + `fn.resize`, each at the
  --dali-threads counts asked for;
- "end to end": a real `python -m producers decode --workers 1` process
  pushing over the wire (ipc://) to a consumer in this process.

A window spans whole passes over a small set (--passes, 4 by default): the
files' costs differ a hundredfold (a large progressive file takes as long as
eighty ordinary ones), so a window of a few hundred images would measure
which of the large files it happened to draw, not the set's mean.

"Per core" is images per CPU-second: of the decoding thread in process
(`time.thread_time`), of this whole process for DALI (all its threads), and
of the producer's process tree end to end; so the figure holds on a machine
other jobs share. Wall-clock images/s is printed beside it. Each is the
median (min-max) of --repeats timed windows. --cold-cache drops the files
from the page cache before every window, so the windows include storage reads
(the ROI decoder's per-stage times show the read apart from the decode).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
from tabulate import tabulate

from consumers.zmq_pull import PullConsumer
from core.cli_types import positive_int
from core.images import decoders
from core.images.decoders import DECODERS, DEFAULT_DECODER
from core.images.files import DatasetError, list_images
from producers.cold_cache import drop_pages, resident_share
from producers.commands import producer_command
from producers.decode import DecodeSource, check_dataset
from profiler.summary import Summary

NextBatch = Callable[[], int]  # makes one batch, returns its images


# Sets up to this many files get windows of whole passes by default; larger ones, DEFAULT_BATCHES batches.
PASSES_UP_TO_FILES = 5000
DEFAULT_BATCHES = 10


def window_batches(args: argparse.Namespace, files: int) -> int:
    """Batches per timed window: --batches, else enough for --passes passes over a small set."""
    if args.batches:
        return args.batches
    if files > PASSES_UP_TO_FILES:
        return DEFAULT_BATCHES
    return max(DEFAULT_BATCHES, math.ceil(args.passes * files / args.batch))


def measure(
    next_batch: NextBatch, cpu_clock: Callable[[], float], args: argparse.Namespace, files: list[Path]
) -> dict[str, Summary]:
    """Images per CPU-second (of `cpu_clock`) and per wall-second over `repeats` windows of `batches` batches."""
    for _ in range(args.warmup):
        next_batch()
    cpu, wall = [], []
    for _ in range(args.repeats):
        if args.cold_cache:
            drop_pages(files)
        images = 0
        c0, w0 = cpu_clock(), time.perf_counter()
        for _ in range(args.batches):
            images += next_batch()
        cpu.append(images / max(cpu_clock() - c0, 1e-9))
        wall.append(images / (time.perf_counter() - w0))
    return {"per_core": Summary.of(cpu), "wall": Summary.of(wall)}


def python_batches(args: argparse.Namespace, decoder: str) -> NextBatch:
    # No Pillow fallback here: a stack that failed would be timed as Pillow.
    source = DecodeSource(args.data, args.list, args.batch, args.image_size, decoder=decoder, fallback=False)
    it: Iterator = source(0)
    return lambda: len(next(it)[0])


def dali_pipeline(args: argparse.Namespace, roi: bool, threads: int):
    """DALI on the CPU: full decode + random_resized_crop, or its ROI decoder + resize."""
    from core.images.dali import build_pipeline, import_dali

    files, labels, _ = list_images(args.data, args.list)
    if not roi:
        return build_pipeline(args.data, files, labels, args.batch, args.image_size, "cpu", num_threads=threads)
    dali = import_dali()
    from nvidia.dali import fn, types

    @dali.pipeline_def(batch_size=args.batch, num_threads=threads, device_id=None, seed=1, prefetch_queue_depth=2)
    def roi_train():
        jpegs, label = fn.readers.file(file_root=args.data, files=files, labels=labels, random_shuffle=True)
        images = fn.decoders.image_random_crop(
            jpegs, device="cpu", output_type=types.RGB, random_area=(0.08, 1.0), random_aspect_ratio=(3 / 4, 4 / 3)
        )
        images = fn.resize(images, resize_x=args.image_size, resize_y=args.image_size)  # antialiased by default
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, fn.cast(label, dtype=types.INT32)

    pipe = roi_train()
    pipe.build()
    return pipe


def dali_batches(args: argparse.Namespace, roi: bool, threads: int) -> NextBatch:
    from producers.dali_source import host_batch

    pipe = dali_pipeline(args, roi, threads)
    return lambda: len(host_batch(pipe)[0])


def _tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of a process and its children (the launcher and its worker), to the nanosecond.

    From each thread's /proc/<pid>/task/<tid>/schedstat, not the 10 ms clock ticks of cpu_times.
    """
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        for stat in Path(f"/proc/{p.pid}/task").glob("*/schedstat"):
            try:
                total += int(stat.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread or process that has just ended
    return total / 1e9


def end_to_end(args: argparse.Namespace, decoder: str, files: list[Path]) -> dict:
    """One producer worker pushing over ipc:// to a consumer here; per core from the producer's CPU time.

    The producer's own per-stage times arrive in the native headers (`stage_ms`): returned as `stages`.
    """
    total = args.warmup + args.repeats * args.batches
    with tempfile.TemporaryDirectory(prefix="feedbench-decode-") as tmp:
        endpoint = f"ipc://{tmp}/decode"
        with PullConsumer(endpoint, bind=True, hwm=4, recv_timeout=120) as consumer:
            cmd = producer_command("decode", endpoint, args.batch, args.image_size, args.data, 1, count=total)
            cmd += ["--decoder", decoder, "--give-up-after", "30"] + (["--list", args.list] if args.list else [])
            proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent)
            try:
                ps = psutil.Process(proc.pid)
                r = measure(lambda: len(consumer.recv().arrays[0]), lambda: _tree_cpu(ps), args, files)
                extras = next(iter(consumer.tracker.producers.values())).extras
            except BaseException:
                proc.kill()
                raise
        try:
            proc.wait(60)  # the producer leaves once it has sent its count and its consumer has hung up
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {**r, "stages": extras.get("stage_ms", {})}


def _stages_line(stages: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in stages.items()) + " ms per image" if stages else ""


def candidates(args: argparse.Namespace, files: list[Path]) -> list[tuple[str, str, Callable[[], dict]]]:
    """(producer, stack, measure) of every row asked for."""
    rows: list[tuple[str, str, Callable[[], dict]]] = []
    for d in args.decoders:
        rows.append(("in process", d, lambda d=d: measure(python_batches(args, d), time.thread_time, args, files)))
    if not args.no_dali:
        for roi in (True, False):
            for t in args.dali_threads:
                stack = f"{'image_random_crop' if roi else 'image + random_resized_crop'}, {t} thread{'s' * (t > 1)}"
                rows.append(("DALI cpu", stack, lambda r=roi, t=t: measure(dali_batches(args, r, t), time.process_time, args, files)))  # fmt: skip
    if not args.no_wire:
        for d in args.decoders:
            rows.append(("end to end", f"{d}, 1 worker, ipc://", lambda d=d: end_to_end(args, d, files)))
    return rows


def run(args: argparse.Namespace) -> int:
    try:
        names, _, classes = check_dataset(args.data, args.list, 1, args.cold_cache)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.batches = window_batches(args, len(names))
    files = [Path(args.data) / f for f in names]
    results, stages = [], {}
    for producer, stack, run_one in candidates(args, files):
        decoders.reset_stages()
        try:
            r = run_one()
        except ImportError as e:
            print(f"note: {producer} {stack} skipped: {e}", file=sys.stderr)
            continue
        results.append((producer, stack, r))
        line = _stages_line(r.get("stages") or decoders.stage_ms())
        if line:
            stages[f"{producer} / {stack}"] = line
        print(f"  {producer} / {stack}: {r['per_core'].median:.0f} images/s per core", file=sys.stderr, flush=True)
    report(args, results, stages, len(files), len(classes), files)
    return 0


def report(args: argparse.Namespace, results: list, stages: dict, n: int, classes: int, files: list[Path]) -> None:
    dali = [r["per_core"].median for p, _, r in results if p == "DALI cpu"]
    best = max(dali) if dali else None
    rows = []
    for producer, stack, r in results:
        row = [producer, stack, r["per_core"].fmt(".0f"), r["wall"].fmt(".0f")]
        if best:
            row.append(f"{r['per_core'].median / best:.2f}")
        rows.append(row)
    cache = "dropped from the page cache before every window" if args.cold_cache else "served from the page cache"
    print(
        f"\nDecode: {n} files in {classes} classes under {args.data} -> {args.batch}x{args.image_size}x"
        f"{args.image_size}x3 uint8, random-resized crop + flip;\nmedian (min–max) of {args.repeats} windows of "
        f"{args.batches} batches ({args.batches * args.batch / n:.1f} passes over the set) after {args.warmup} "
        f"warm-up batches; files {cache} "
        f"({100 * resident_share(files):.0f} % cached at the end)\n"
    )
    headers = ["producer", "stack", "images/s per core", "images/s wall"]
    if best:
        headers.append("per core / best DALI")
    print(tabulate(rows, headers=headers))
    for stack, line in stages.items():
        print(f"\n{stack}: {line}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-decode", help="benchmark decoding: the decode producer vs DALI on CPU, per core")
    p.add_argument("--data", required=True, metavar="DIR", help="ImageNet-layout folder (see make-dataset)")
    p.add_argument("--list", metavar="FILE", help="use only these files: lines of 'relative/path [label]'")
    p.add_argument("--image-size", type=positive_int, default=224, help="output height and width")
    p.add_argument("--batch", type=positive_int, default=32, help="images per batch")
    p.add_argument(
        "--batches",
        type=positive_int,
        help=f"batches per timed window (default: --passes passes over a set of up to {PASSES_UP_TO_FILES} files, "
        f"else {DEFAULT_BATCHES})",
    )
    p.add_argument("--passes", type=positive_int, default=4, help="passes over a small set per window (see --batches)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed windows; the median is reported")
    p.add_argument("--warmup", type=positive_int, default=3, help="batches before timing starts")
    p.add_argument(
        "--decoders",
        nargs="+",
        choices=sorted(DECODERS),
        default=[DEFAULT_DECODER, "simplejpeg"],
        help="decoding stacks of the decode producer to measure (default: the ROI decoder and simplejpeg)",
    )
    p.add_argument("--dali-threads", type=positive_int, nargs="+", default=[1, 2], help="DALI num_threads to try")
    p.add_argument("--no-dali", action="store_true", help="leave DALI out")
    p.add_argument("--no-wire", action="store_true", help="leave out the end-to-end rows (producer process + wire)")
    p.add_argument("--cold-cache", action="store_true", help="drop the files from the page cache before every window")
    p.set_defaults(func=run)
