"""benchmarks/emulated_vs_real.py on the H200's real-data result (docs/gpu-runs/2026-11-28-h200): a path whose
model did not train is not compared, and two valid results are read as agreeing exactly where their ratio
intervals overlap."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

from conftest import ROOT

REAL = ROOT / "docs/gpu-runs/2026-11-28-h200/real_data-p4.json"


def _valid(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    for r in doc["paths"].values():
        r["training"]["invalid"], r["loss_finite"] = None, True
    return doc


def test_an_invalid_result_is_not_compared():
    p = subprocess.run([sys.executable, "-m", "benchmarks.emulated_vs_real", str(REAL), str(REAL)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("not compared: loss non-finite from step 4") == 4, p.stdout


def test_ratios_agree_where_their_intervals_overlap_and_differ_where_they_do_not():
    from benchmarks.emulated_vs_real import rows

    real = _valid(json.loads(REAL.read_text()))
    emulated = copy.deepcopy(real)
    loader = emulated["paths"]["loader"]  # the real loader read 0.13 (0.12–0.20)
    loader["ratio_to_baseline"], loader["uncertainty"]["ratio"] = 0.26, [0.24, 0.30]
    decode = emulated["paths"]["gpu-decode"]  # the real gpu-decode read 0.31 (0.30–0.32)
    decode["ratio_to_baseline"], decode["uncertainty"]["ratio"] = 0.33, [0.32, 0.35]
    got = {row[0]: row[-1] for row in rows(real, emulated)}
    assert got["loader"] == "differ: the emulated ratio +105%", got  # 0.26 against 0.1266
    assert got["gpu-decode"] == "agree (intervals overlap)", got
    assert got["zmq-consume"] == "agree (intervals overlap)", got
