"""`python -m benchmarks.telemetry_overhead`: what telemetry costs the timed steps, measured in one invocation.

Runs the `gpu` baseline with telemetry on and with --no-telemetry, alternating
so that both see the same machine load, and prints each run's median images/s
and the difference of the medians. Telemetry traces and samples only untimed
steps between the windows (harness/schedule.py), so the two should agree
to within the noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from core.cli_types import positive_int
from core.config import BenchConfig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_overhead", description=__doc__)
    p.add_argument("--pairs", type=positive_int, default=15, help="on/off run pairs (default 15)")
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--num-gpus", type=positive_int, default=1)
    p.add_argument("--warmup-steps", type=positive_int, default=20)
    p.add_argument("--steps", type=positive_int, default=100)
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--resnet", action="store_true", help="train ResNet-50 instead of the input-only stand-in")
    p.add_argument("--framework", choices=("tf", "torch"), default="tf", help="the trainer whose telemetry is measured")
    args = p.parse_args(argv)

    from harness import run as harness_run
    from harness.run import one_path, prepare

    one_node = argparse.Namespace(nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=None)
    trainer = harness_run.load(args.framework, one_node)
    gpus = trainer.gpu_count()

    def config(telemetry: bool) -> BenchConfig:
        cfg = BenchConfig(
            paths=["gpu"],
            num_gpus=args.num_gpus,
            batch=args.batch,
            image_size=args.image_size,
            warmup_steps=args.warmup_steps,
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
            print(
                f"pair {i + 1}, telemetry {'on ' if telemetry else 'off'}: {rates[telemetry][-1]:10.1f} images/s, "
                f"step p50 {p50[telemetry][-1]:.3f} ms",
                flush=True,
            )
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    # Each pair ran back to back, under the same load: their ratio is steadier than either figure.
    ratio = statistics.median(a / b for a, b in zip(rates[True], rates[False], strict=True))
    print(
        f"\nmedian images/s over {args.pairs} runs each: telemetry on {on:.1f}, off {off:.1f} "
        f"({100 * (on - off) / off:+.2f}%); median on/off ratio of the pairs {ratio:.4f} ({100 * (ratio - 1):+.2f}%); "
        f"median step p50: on {statistics.median(p50[True]):.3f} ms, off {statistics.median(p50[False]):.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
