"""--interleave N: refused where no run of paths against their baseline is made, and worded for what it measured.

A capacity search's probes, a sweep's grid points and the loader alone are not interleaved: the flag is refused
there before anything runs, rather than recorded in the results and not done. Where it runs, a path's ratio
interval is that of the N paired ratios: the verdict says "over N pairs of alternating runs", not the path's own
windows, and asks for more pairs (--interleave), not for --repeats, which adds no pair.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--input-only", "--batch", "4", "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2"]

pytestmark = pytest.mark.timeout(600)


def bench(tmp_path: Path, *args: str, timeout: float = 500) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench_input.py"), *args], cwd=tmp_path, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize(
    "flags",
    [
        ["--find-capacity", "--emulate", "H100", "--fake-location", "python-queue"],
        ["--sweep", "--batch", "2,4", "--fake-location", "python-queue"],
        ["--loader-only", "--loader", "examples/torchvision_imagefolder.py:make_loader"],
    ],
    ids=["find-capacity", "sweep", "loader-only"],
)
def test_interleave_is_refused_where_no_run_alternates_with_the_baseline(tmp_path, flags):
    p = bench(tmp_path, *flags, "--interleave", "2", "--out", "out", timeout=120)
    assert p.returncode == 2, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --interleave 2 and {flags[0]}: "), p.stderr[-3000:]
    assert "images/s" not in p.stdout and not (tmp_path / "out").exists()  # nothing ran


def _straddling(doc: dict, path: str) -> dict:
    """The run's results with `path`'s two pairs moved to ratios of 0.95 and 1.04 (their baselines as run)."""
    results = copy.deepcopy(doc["paths"])
    inter = results[path]["interleaved"]
    base = inter["baseline_images_per_sec"]
    inter["images_per_sec"] = [0.95 * base[0], 1.04 * base[1]]
    inter["ratios"] = [0.95, 1.04]
    inter["ratio"] = (0.95 + 1.04) / 2
    return results


def test_an_interleaved_paths_interval_and_advice_are_worded_in_pairs(tmp_path):
    """A real run with --interleave 2; its verdict for the path, and the same run's result with the two paired
    ratios moved either side of 1.0 (so the verdict is "within noise" whatever the machine did): the interval
    is said to be over 2 pairs of alternating runs, and the advice is more pairs, never --repeats."""
    from profiler.report import add_ratios
    from profiler.verdict import add_verdicts

    p = bench(tmp_path, "--fake-location", "python-queue", *SMALL, "--interleave", "2", "--json", "run.json")
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["paths"]["python-queue"]["interleaved"]["pairs"] == 2
    ran = doc["paths"]["python-queue"]["verdict"]
    if ran["level"] == "same as baseline (within noise)":  # the run's own words, where the machine gave that
        assert "over 2 pairs of alternating runs (--interleave 2) holds 1.0" in ran["evidence"], ran
        assert "--repeats" not in ran["advice"], ran
    results = _straddling(doc, "python-queue")
    add_ratios(results, steps_per_window=3)
    add_verdicts(results, framework="tf")
    v = results["python-queue"]["verdict"]
    assert v["level"] == "same as baseline (within noise)", v
    assert "interval 0.95–1.04 over 2 pairs of alternating runs (--interleave 2) holds 1.0" in v["evidence"], v
    assert "windows" not in v["evidence"] and "--repeats" not in v["advice"], v
    assert "pairs of alternating runs would be needed (--interleave " in v["advice"], v


def test_pytorch_alternates_its_windows_in_one_launch_in_the_order_asked(tmp_path):
    """PyTorch trains the whole alternation in one torchrun launch (a path named as often as it runs): two
    launches in all (the run's own, then the alternation), seen as the rank processes the run started; the
    ranks print each run as it starts, baseline and path swapped every pair, and each pair's ratio is its own
    two windows'. A launch per window would start ranks and build the model for every window (about 25 s each
    for ResNet-50 on an H200)."""
    import psutil

    cmd = [sys.executable, str(ROOT / "bench_input.py"), "--framework", "torch", "--fake-location", "python-queue",
           *SMALL, "--num-gpus", "1", "--interleave", "2", "--json", "run.json"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks: dict[int, int] = {}  # pid: parent pid
    with proc:
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:  # every rank process lives for seconds: a 20 ms look never misses one
            for child in watched.children(recursive=True):
                try:
                    if "-m harness.torch.run --config" in " ".join(child.cmdline()):  # not the launcher
                        ranks[child.pid] = child.ppid()
                except psutil.Error:
                    pass
            time.sleep(0.02)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    ranks = {pid: up for pid, up in ranks.items() if up not in ranks}  # a rank's forked workers share its command
    assert len(ranks) == 2, f"one rank in each of 2 launches expected, saw {len(ranks)} rank processes"
    after = out.split("- python-queue: 2 pairs of runs each, alternating with the baseline ...", 1)[1]
    started = [ln.strip() for ln in after.splitlines() if ln.startswith("- ")]
    assert started == ["- gpu ...", "- python-queue ...", "- python-queue ...", "- gpu ..."], out[-3000:]
    inter = json.loads((tmp_path / "run.json").read_text())["paths"]["python-queue"]["interleaved"]
    assert inter["pairs"] == 2 and "invalid" not in inter, inter
    for mine, base, ratio in zip(inter["images_per_sec"], inter["baseline_images_per_sec"], inter["ratios"]):
        assert mine > 0 and base > 0 and abs(ratio - mine / base) < 1e-9, inter
