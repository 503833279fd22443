"""--interleave N: the baseline and a path measured turn about, so a disturbance on a shared machine hits both.

A run measures its paths one after another; on a shared machine a
neighbour's burst during one path's windows reads as that path being slow.
Here each path is measured again in N pairs of short runs (one timed
window each) alternating with the baseline, first one then the other, and
its ratio is the median of the N paired ratios: each pair ran back to
back, under the same load (the method of benchmarks/telemetry_overhead.py).
A trainer that runs each path in its own process or launch (PyTorch's
torchrun) alternates launches; TensorFlow alternates runs in this process.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace

from core.config import BASELINE, BenchConfig


def alternate(run_one: Callable[[BenchConfig, str], dict], cfg: BenchConfig, path: str, pairs: int) -> dict:
    """`pairs` (baseline, path) runs of one window each, the order swapped every pair; the paired ratios."""
    one = replace(cfg, repeats=1, json_path=None, profile_dir=None, quiet=True)
    base, mine, ratios = [], [], []
    for i in range(pairs):
        # By position, not by name: `path` may be the baseline itself (benchmarks/interleave_self.py).
        first, second = (
            run_one(one, p)["images_per_sec"]["median"] for p in ((BASELINE, path) if i % 2 == 0 else (path, BASELINE))
        )
        b, m = (first, second) if i % 2 == 0 else (second, first)
        base.append(b)
        mine.append(m)
        ratios.append(m / b if b > 0 else 0.0)
    return {
        "method": "alternating runs",
        "pairs": pairs,
        "steps_per_run": cfg.steps,
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "baseline_images_per_sec": base,
        "images_per_sec": mine,
    }
