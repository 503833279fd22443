"""`make gpu-check` (`python -m benchmarks.gpu_check`): the first run on a GPU machine checks itself.

In under eight minutes on one GPU (its steps' time caps add up to BUDGET_S),
it runs, each in its own process (this module imports neither framework):

1. TensorFlow's real placement of every path and variable update on one GPU,
   compared with the plan; with 2+ GPUs also the replicated (NCCL all-reduce)
   graphs for two (`python -m harness.tf.gpu_check`);
2. the PyTorch trainer's own check on one GPU (`python -m harness.torch.gpu_check`):
   pinned and pageable host-to-device bandwidth, then every path in one
   torchrun launch (zmq-consume over shm:// in a second), start-up shared;
3. a short run of every default TensorFlow path on one GPU;

then bounds the figures (`figure_problems`): every path's model must have trained (finite loss, no
skipped update in a timed window: profiler/training.py), no path may beat the on-device
baseline beyond the interval of their alternated runs (`--interleave`, the default on a GPU; a ratio of
runs one after another carries the drift between them and is not bounded so), the baseline must reach a stated share of the
GPU's published ResNet-50 rate, and a path's slowdown must be what its input
wait says. A table shows each path's ratio to its trainer's baseline.

On a machine without an NVIDIA GPU it says so in one line and exits 0.
Exit status 1 when a check failed; every step's output is shown as it runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core import gpus
from core.emulate import PRESETS
from profiler.training import invalid_reason, invalid_words
from profiler.uncertainty import ratio_interval

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 450  # the whole check: 7.5 minutes, within eight with room for start-up and the table
# (title, module and arguments, cap in seconds): the caps add up to BUDGET_S at most.
STEPS = (
    ("TensorFlow: placement of every path, as planned?", ["-m", "harness.tf.gpu_check", "--num-gpus", "1"], 120),
    ("PyTorch: bandwidth and every path, one GPU", ["-m", "harness.torch.gpu_check", "--num-gpus", "1"], 170),
    ("TensorFlow: every default path, one GPU, short run", ["bench_input.py", "--framework", "tf"], 160),
)
# A short schedule in mixed precision (as the published rates): enough steps past start-up for a ratio.
SHORT_RUN = ["--num-gpus", "1", "--use-fp16", "--warmup-steps", "10", "--steps", "30", "--repeats", "3"]
# The on-device baseline must reach this share of the GPU's published ResNet-50 rate (core/emulate.py, mixed
# precision, tuned large-batch MXNet/DALI runs; TensorFlow without XLA and eager PyTorch at batch 64 reach
# well under that, but not under a quarter): far below, the GPU is throttled, shared, or the trainer is wrong.
MIN_SHARE_OF_PUBLISHED = 0.25
# A path's slowdown (1 - ratio) and its input wait share may differ by this much before they disagree.
WAIT_TOLERANCE = 0.15
BASELINE = "gpu"


def _step(title: str, cmd: list[str], deadline: float, cap_s: float) -> tuple[bool, str]:
    """Run `cmd` from the repository root with the time left (at most `cap_s`); (succeeded, its output)."""
    left = min(cap_s, deadline - time.monotonic())
    print(f"\n== {title}", flush=True)
    if left < 10:
        print("   skipped: out of time")
        return False, ""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        print(f"   stopped after {left:.0f} s")
        return False, ""
    out = proc.stdout + proc.stderr
    shown = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith(("W0", "I0", "E0", "WARNING: All"))]
    print("\n".join("   " + ln for ln in shown[-40:]), flush=True)
    return proc.returncode == 0, out


def _results(path: str) -> dict[str, dict]:
    try:
        return json.loads(Path(path).read_text()).get("paths", {})
    except (OSError, ValueError):
        return {}


def _ratios(results: dict[str, dict]) -> dict[str, float | None]:
    return {p: r.get("ratio_to_baseline") for p, r in results.items()}


def _windows(result: dict) -> list[float]:
    ips = result.get("images_per_sec") or {}
    return list(ips.get("repeats") or [ips["median"]]) if "median" in ips else []


def published_rate(gpu_name: str) -> tuple[str, float] | None:
    """(preset, images/s) of the published ResNet-50 rate for a GPU named like `gpu_name`, None if none is."""
    for name, preset in PRESETS.items():
        if name.lower() in gpu_name.lower():
            return name, preset.images_per_sec
    return None


def figure_problems(framework: str, results: dict[str, dict], gpu_name: str, fp16: bool = True) -> list[str]:
    """One line per figure out of bounds in one trainer's results (path -> result, `gpu` the baseline)."""
    untrained = [
        f"{framework}: {path}: {invalid_words(bad)}" for path, r in results.items() if (bad := invalid_reason(r))
    ]  # a model that does not train gives no figure: nothing else of the run is read
    if untrained:
        return untrained
    base = results.get(BASELINE)
    if not base or not _windows(base):
        return [f"{framework}: no baseline ({BASELINE}) figure to bound the others by"]
    problems, bw = [], _windows(base)
    rate = statistics.median(bw)
    known = published_rate(gpu_name)
    if known and fp16 and rate < MIN_SHARE_OF_PUBLISHED * known[1]:
        problems.append(
            f"{framework}: the {BASELINE} baseline trained {rate:.0f} images/s, below "
            f"{MIN_SHARE_OF_PUBLISHED:.0%} of the published {known[0]} rate ({known[1]:.0f} images/s, core/emulate.py)"
        )
    for path, r in results.items():
        w = _windows(r)
        if path == BASELINE or not w:
            continue
        lo, hi, _, _ = ratio_interval(w, bw)
        ratio = statistics.median(w) / rate if rate > 0 else math.nan
        alternated = r.get("interleaved")
        if alternated:  # runs alternated with the baseline (the default on a GPU): no drift between the sides
            lo, hi, _, _ = ratio_interval(alternated["images_per_sec"], alternated["baseline_images_per_sec"], True)
        # A ratio of paths run one after another carries the drift between them (an H200, 2026-11-26: the
        # baseline, always first, ran 0.4-0.6% below the fed paths; docs/gpu.md): only an alternated one
        # bounds the baseline.
        if alternated and alternated["pairs"] > 1 and lo > 1.0:
            problems.append(
                f"{framework}: the {BASELINE} baseline ran slower than {path} beyond the interval of their "
                f"alternated runs (ratio {lo:.2f}-{hi:.2f}): the on-device baseline is the ceiling, so the run is "
                "not to be trusted"
            )
        share = (r.get("telemetry") or {}).get("input_wait_share")
        if share is not None and not math.isnan(ratio):
            slowdown = max(0.0, 1.0 - ratio)
            if abs(share - slowdown) > max(WAIT_TOLERANCE, hi - lo):
                problems.append(
                    f"{framework}: {path} ran at {ratio:.2f} of the baseline ({slowdown:.0%} slower) but its "
                    f"telemetry says it waited for input {share:.0%} of the time"
                )
    return problems


def ratio_table(tf_ratios: dict, torch_ratios: dict) -> str:
    """Path | TensorFlow | PyTorch, each path's images/s as a ratio to its own trainer's baseline."""
    rows = ["| path | TensorFlow | PyTorch |", "|---|---|---|"]
    for path in dict.fromkeys([*tf_ratios, *torch_ratios]):
        cells = [
            f"{r[path]:.2f}" if r.get(path) is not None else ("" if path not in r else "n/a")
            for r in (tf_ratios, torch_ratios)
        ]
        rows.append(f"| {path} | {cells[0] or '-'} | {cells[1] or '-'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__).parse_args(argv)
    found = gpus.nvidia_gpus()
    if not found:
        print("gpu-check: no NVIDIA GPU on this machine (nvidia-smi -L, /proc/driver/nvidia/gpus): nothing to check")
        return 0
    deadline = time.monotonic() + BUDGET_S
    py = sys.executable
    print(f"gpu-check: {len(found)} NVIDIA GPU(s): " + "; ".join(found), flush=True)
    failed, results = [], {}
    with tempfile.TemporaryDirectory(prefix="feedbench-gpu-check-") as tmp:
        for (title, args, cap), key in zip(STEPS, ("tf placement", "torch", "tf"), strict=True):
            extra = []
            if key == "tf placement" and len(found) > 1:
                extra = ["--multi-gpu", "2"]  # the NCCL all-reduce graphs, where there are GPUs to build them for
            elif key in ("torch", "tf"):
                extra = ["--json", f"{tmp}/{key}.json"] + (SHORT_RUN if key == "tf" else ["--use-fp16"])
            ok, _ = _step(title, [py, *args, *extra], deadline, cap)
            if not ok:
                failed.append(key)
            if key in ("torch", "tf"):
                results[key] = _results(f"{tmp}/{key}.json")
    name = found[0]
    for framework, label in (("tf", "TensorFlow"), ("torch", "PyTorch")):
        lines = figure_problems(label, results[framework], name) if results[framework] else []
        for line in lines:
            print(f"   bound: {line}")
        if lines:
            failed.append(f"{framework} figures")
    print("\n== each path's images/s as a ratio to its trainer's baseline (short runs, one GPU)")
    print(ratio_table(_ratios(results["tf"]), _ratios(results["torch"])))
    print(f"\ngpu-check: {'failed: ' + ', '.join(failed) if failed else 'every check passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
