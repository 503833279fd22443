"""`python -m benchmarks.interleave_self`: the baseline against itself in alternated runs reads 1.00 within its interval.

What `--interleave` (the default on a GPU) rests on: each pair runs the `gpu`
baseline twice back to back, the order of the two sides swapped every pair
(harness/interleave.py), so a machine that warms up or slows down moves both
sides of the ratio alike. Against itself the paired ratio's interval
(profiler/uncertainty.py `ratio_interval`, paired) must hold 1.0; this prints
every pair, the median ratio and its interval.
"""

from __future__ import annotations

import argparse
import sys

from core.cli_types import positive_int
from core.config import BASELINE, BenchConfig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.interleave_self", description=__doc__)
    p.add_argument("--pairs", type=positive_int, default=7, help="alternated pairs of one-window runs (default 7)")
    p.add_argument("--framework", choices=("tf", "torch"), default="tf")
    p.add_argument("--input-only", action="store_true", help="the input-only stand-in instead of ResNet-50")
    p.add_argument("--steps", type=positive_int, help="timed steps of each run's window (default: the machine's)")
    args = p.parse_args(argv)

    from harness import run as harness_run
    from harness.interleave import alternate
    from harness.run import prepare, train_in_turn
    from profiler.uncertainty import ratio_interval

    one_node = argparse.Namespace(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=None)
    trainer = harness_run.load(args.framework, one_node)
    gpus = trainer.gpu_count()
    cfg = BenchConfig(paths=[BASELINE], input_only=args.input_only, steps=args.steps, interleave=args.pairs)
    for note in prepare(trainer, cfg, gpus):
        print(f"note: {note}", flush=True)

    got = alternate(lambda c: train_in_turn(trainer, c), cfg, [BASELINE], args.pairs)[BASELINE]
    for i, (a, b, r) in enumerate(zip(got["baseline_images_per_sec"], got["images_per_sec"], got["ratios"]), 1):
        print(f"pair {i}: {a:10.1f} / {b:10.1f} images/s, ratio {r:.4f}", flush=True)
    lo, hi, conf, how = ratio_interval(got["images_per_sec"], got["baseline_images_per_sec"], paired=True)
    holds = lo <= 1.0 <= hi
    print(
        f"\n{BASELINE} against itself, {args.pairs} alternated pairs ({args.framework}, "
        f"{'input-only' if args.input_only else 'ResNet-50'}, batch {cfg.batch}, {cfg.image_size}px, "
        f"{cfg.steps} steps a window): median ratio {got['ratio']:.3f}, interval {lo:.3f}-{hi:.3f} "
        f"({conf:.0%}, {how}): {'holds' if holds else 'does not hold'} 1.00"
    )
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
