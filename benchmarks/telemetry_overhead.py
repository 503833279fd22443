"""`python -m benchmarks.telemetry_overhead`: what telemetry costs the timed steps.

Runs the `gpu` baseline with telemetry on and with --no-telemetry, alternating
so that both see the same machine load, and prints each run's median images/s,
each pair's on/off ratio and the median ratio. By default the runs share this
process; `--separate` runs each as its own `bench_input.py --fake-location gpu
--input-only` invocation (the way a user compares them), with the machine's
load average beside each pair. Telemetry traces and samples only untimed steps
between the windows (harness/schedule.py) and adds no hook to a timed step
(harness/tf/measure.py), so the two should agree to within the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from core.cli_types import positive_int
from core.config import BenchConfig


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_overhead", description=__doc__)
    p.add_argument("--pairs", type=positive_int, default=15, help="on/off run pairs (default 15)")
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--num-gpus", type=positive_int, help="towers (default 1; --separate: bench_input.py's default)")
    p.add_argument("--warmup-steps", type=positive_int, help="(default 20; --separate: bench_input.py's default)")
    p.add_argument("--steps", type=positive_int, default=100)
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--resnet", action="store_true", help="train ResNet-50 instead of the input-only stand-in")
    p.add_argument("--framework", choices=("tf", "torch"), default="tf", help="the trainer whose telemetry is measured")
    p.add_argument("--separate", action="store_true", help="each run its own bench_input.py process")
    return p.parse_args(argv)


def in_process(args: argparse.Namespace) -> tuple[dict[bool, list[float]], dict[bool, list[float]]]:
    """Each pair's images/s and step p50, on and off, all runs in this process (one model build each)."""
    from harness import run as harness_run
    from harness.run import one_path, prepare

    one_node = argparse.Namespace(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=None)
    trainer = harness_run.load(args.framework, one_node)
    gpus = trainer.gpu_count()

    def config(telemetry: bool) -> BenchConfig:
        cfg = BenchConfig(
            paths=["gpu"],
            num_gpus=args.num_gpus or 1,
            batch=args.batch,
            image_size=args.image_size,
            warmup_steps=args.warmup_steps or 20,
            steps=args.steps,
            repeats=args.repeats,
            input_only=not args.resnet,
            telemetry=telemetry,
        )
        prepare(trainer, cfg, gpus)
        return cfg

    rates: dict[bool, list[float]] = {True: [], False: []}
    p50: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.pairs):
        for telemetry in (i % 2 == 0, i % 2 != 0):  # alternate which goes first
            r = one_path(trainer, config(telemetry), "gpu")
            rates[telemetry].append(r["images_per_sec"]["median"])
            p50[telemetry].append(r["step_time_ms"]["p50"])
            _line(i, telemetry, rates[telemetry][-1], p50[telemetry][-1])
    return rates, p50


def separate(args: argparse.Namespace) -> tuple[dict[bool, list[float]], dict[bool, list[float]]]:
    """Each pair's images/s and step p50, each run a `bench_input.py` process of its own (`--json` to read it)."""
    flags = ["--fake-location", "gpu", "--batch", str(args.batch), "--image-size", str(args.image_size)]
    flags += ["--steps", str(args.steps), "--repeats", str(args.repeats), "--framework", args.framework]
    flags += [] if args.resnet else ["--input-only"]
    flags += ["--num-gpus", str(args.num_gpus)] if args.num_gpus else []
    flags += ["--warmup-steps", str(args.warmup_steps)] if args.warmup_steps else []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rates: dict[bool, list[float]] = {True: [], False: []}
    p50: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            load = os.getloadavg()[0]
            for telemetry in (i % 2 == 0, i % 2 != 0):
                out = os.path.join(tmp, f"{i}-{telemetry}.json")
                cmd = [sys.executable, os.path.join(root, "bench_input.py"), *flags, "--json", out]
                subprocess.run(cmd + ([] if telemetry else ["--no-telemetry"]), check=True, capture_output=True)
                with open(out) as f:
                    r = json.load(f)["paths"]["gpu"]
                rates[telemetry].append(r["images_per_sec"]["median"])
                p50[telemetry].append(r["step_time_ms"]["p50"])
                _line(i, telemetry, rates[telemetry][-1], p50[telemetry][-1])
            ratio = rates[True][-1] / rates[False][-1]
            print(f"pair {i + 1}: on/off {ratio:.3f}, load average {load:.2f} before it", flush=True)
    return rates, p50


def _line(i: int, telemetry: bool, rate: float, p50: float) -> None:
    on = "on " if telemetry else "off"
    print(f"pair {i + 1}, telemetry {on}: {rate:10.1f} images/s, step p50 {p50:.3f} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    rates, p50 = separate(args) if args.separate else in_process(args)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    # Each pair ran back to back, under the same load: their ratio is steadier than either figure.
    ratios = [a / b for a, b in zip(rates[True], rates[False], strict=True)]
    ratio = statistics.median(ratios)
    print(
        f"\nmedian images/s over {args.pairs} runs each: telemetry on {on:.1f}, off {off:.1f} "
        f"({100 * (on - off) / off:+.2f}%); on/off ratio of each pair {', '.join(f'{x:.3f}' for x in ratios)}; "
        f"median {ratio:.4f} ({100 * (ratio - 1):+.2f}%); "
        f"median step p50: on {statistics.median(p50[True]):.3f} ms, off {statistics.median(p50[False]):.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
