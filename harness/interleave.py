"""--interleave N: the baseline and a path measured turn about, so a disturbance on a shared machine hits both.

A run measures its paths one after another; on a shared machine a
neighbour's burst during one path's windows reads as that path being slow.
Here each path is measured again in N pairs of short runs (one timed
window each) alternating with the baseline, first one then the other, and
its ratio is the median of the N paired ratios: each pair ran back to
back, under the same load (the method of benchmarks/telemetry_overhead.py).
The whole alternation is one call of the trainer (`run_in_turn`): PyTorch
trains it in one torchrun launch, a path named as often as it runs, so no
window pays for starting ranks; TensorFlow alternates runs in this process.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace

from core.config import BASELINE, BenchConfig
from profiler.training import invalid_reason


def alternate(
    run_in_turn: Callable[[BenchConfig], list[dict]], cfg: BenchConfig, paths: list[str], pairs: int
) -> dict[str, dict]:
    """Each path's `pairs` (baseline, path) runs of one window each, the order swapped every pair; its paired
    ratios. One call of the trainer for every path: each path's pairs run back to back, then the next path's.

    `run_in_turn(cfg)` trains `cfg.paths` in the order given and returns one result per entry.
    """
    order = [p for path in paths for i in range(pairs) for p in ((BASELINE, path) if i % 2 == 0 else (path, BASELINE))]
    one = replace(cfg, paths=order, repeats=1, json_path=None, profile_dir=None, quiet=True)
    runs = run_in_turn(one)
    return {path: _paired(runs[2 * pairs * k : 2 * pairs * (k + 1)], cfg) for k, path in enumerate(paths)}


def _paired(runs: list[dict], cfg: BenchConfig) -> dict:
    """The `interleaved` block of one path from its runs, in the order they ran (baseline first in even pairs)."""
    pairs = len(runs) // 2
    invalid = next((why for r in runs if (why := invalid_reason(r))), None)  # every window's model must train
    base, mine, ratios, states = [], [], [], {"gpu_state": [], "baseline_gpu_state": []}
    for i in range(pairs):
        # By position, not by name: the path may be the baseline itself (benchmarks/interleave_self.py).
        b, m = (runs[2 * i], runs[2 * i + 1]) if i % 2 == 0 else (runs[2 * i + 1], runs[2 * i])
        base.append(b["images_per_sec"]["median"])
        mine.append(m["images_per_sec"]["median"])
        ratios.append(mine[-1] / base[-1] if base[-1] > 0 else 0.0)
        states["baseline_gpu_state"] += b.get("gpu_state") or []  # NVML's medians per window, on a GPU
        states["gpu_state"] += m.get("gpu_state") or []
    return {
        "method": "alternating runs",
        "pairs": pairs,
        "steps_per_run": cfg.steps,
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "baseline_images_per_sec": base,
        "images_per_sec": mine,
        **{k: v for k, v in states.items() if v},
        **({"invalid": invalid} if invalid else {}),
    }
