"""`make gpu-check` (`python -m benchmarks.gpu_check`): the first run on a GPU machine checks itself.

In under ten minutes on one GPU it runs, each in its own process (this
module imports neither framework):

1. TensorFlow's real placement of every path and variable update, compared
   with the plan (`python -m tf_trainer.gpu_check`);
2. the PyTorch trainer's own check (`python -m torch_trainer.gpu_check`),
   when that module is there;
3. pinned and pageable host-to-device bandwidth (`python -m torch_trainer.bandwidth`);
4. a short run of every default path on both trainers, one GPU, and a table
   of each path's ratio to its trainer's baseline.

On a machine without an NVIDIA GPU it says so in one line and exits 0.
Exit status 1 when a check failed; every step's output is shown as it runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core import gpus

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 570  # the whole check, within ten minutes
# A short schedule: enough steps past start-up for a ratio, not a publishable figure.
SHORT_RUN = ["--num-gpus", "1", "--warmup-steps", "10", "--steps", "30", "--repeats", "2"]


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


def _ratios(path: str) -> dict[str, float | None]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {p: r.get("ratio_to_baseline") for p, r in doc.get("paths", {}).items()}


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
    failed = []
    ok, _ = _step(
        "TensorFlow: placement of every path, as planned?",
        [py, "-m", "tf_trainer.gpu_check", "--num-gpus", "1"],
        deadline,
        180,
    )
    if not ok:
        failed.append("tensorflow placement")
    if (ROOT / "torch_trainer" / "gpu_check.py").exists():
        ok, _ = _step("PyTorch: its own check", [py, "-m", "torch_trainer.gpu_check"], deadline, 120)
        if not ok:
            failed.append("torch check")
    else:
        print("\n== PyTorch: its own check\n   skipped: torch_trainer/gpu_check.py is not there")
    ok, _ = _step(
        "pinned host-to-device bandwidth",
        [py, "-m", "torch_trainer.bandwidth", "--mb", "256", "--repeats", "5"],
        deadline,
        60,
    )
    if not ok:
        failed.append("bandwidth")
    with tempfile.TemporaryDirectory(prefix="feedbench-gpu-check-") as tmp:
        ratios = {}
        for framework in ("tf", "torch"):
            out = f"{tmp}/{framework}.json"
            cmd = [py, "bench_input.py", "--framework", framework, *SHORT_RUN, "--json", out]
            ok, _ = _step(f"{framework}: every default path, one GPU, short run", cmd, deadline, 240)
            if not ok:
                failed.append(f"{framework} run")
            ratios[framework] = _ratios(out)
    print("\n== each path's images/s as a ratio to its trainer's baseline (short runs, one GPU)")
    print(ratio_table(ratios["tf"], ratios["torch"]))
    print(f"\ngpu-check: {'failed: ' + ', '.join(failed) if failed else 'every check passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
