"""A capacity run's results: a probe that crashes keeps the other paths' results, the capacity is in
results.md/.csv and agrees with its own probes, and a second run into the same --out keeps the first's files.

Real processes: bench_input.py as a user starts it, and the TensorFlow trainer with real producers running a
loader that fails on its 10th batch.
"""

from __future__ import annotations

import csv
import json
import os

import pytest
from conftest import QUICK_PROBE_FLAGS, QUICK_PROBES

from core.config import BASELINE, BenchConfig, apply_defaults
from runner.capacity import find_capacities, probe_config, table
from tests.test_loader import finish, start
from tests.test_uncertainty import agrees_with_its_probes

pytestmark = pytest.mark.timeout(600)

BAD = """
import time

import numpy as np


def raises_on_10th():
    for i in range(100):
        if i == 9:
            raise ValueError("corrupt record 9")
        yield np.zeros((8, 16, 16, 3), np.uint8), np.zeros(8, np.int64)


def slow_start():
    # Its first 40 batches take 0.1 s each (workers spinning up, caches filling); then it is fast.
    i = 0
    while True:
        if i < 40:
            time.sleep(0.1)
        i += 1
        yield np.zeros((8, 16, 16, 3), np.uint8), np.zeros(8, np.int64)
"""
QUICK = [
    *"--emulate-rate 2000 --num-gpus 1 --image-size 16 --batch 8 --capacity-tries 1 --capacity-probes 3".split(),
    *QUICK_PROBE_FLAGS,  # these tests check the files, not the figures
]


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("loaders") / "bad_loader.py"
    path.write_text(BAD)
    return f"{path}:raises_on_10th"


@pytest.mark.timing
def test_a_probe_measures_the_path_at_its_demand_not_its_slow_start(bad):
    """Two producers, each slow for its first 40 batches (4 s), then far faster than the demand (400 img/s):
    a probe at 400 img/s must see the path keep up, not the 160 img/s of its start."""
    from harness.tf.run import run_path

    cfg = BenchConfig(
        model="emulated", emulate_rate=400.0, num_gpus=1, image_size=16, batch=8,
        paths=[BASELINE, "zmq-consume"], producer_kind="loader", loader=bad.replace(":raises_on_10th", ":slow_start"),
    )  # fmt: skip
    apply_defaults(cfg, gpus=0)
    r = run_path(probe_config(cfg, 400.0, batch_given=True), "zmq-consume", has_gpu=False)
    assert r["images_per_sec"]["median"] >= 0.8 * 400, r["images_per_sec"]


def test_a_path_whose_probes_crash_leaves_the_other_paths_capacity(bad):
    """python-queue's producers die in every probe (tried twice); cpu, searched after it, still gets its capacity."""
    from harness.tf.run import run_path

    cfg = BenchConfig(
        model="emulated", emulate_rate=2000.0, num_gpus=1, image_size=16, batch=8,
        paths=[BASELINE, "python-queue", "cpu"], producer_kind="loader", loader=bad, capacity_probes=2, **QUICK_PROBES,
    )  # fmt: skip
    apply_defaults(cfg, gpus=0)
    said: list[str] = []
    results, figures = find_capacities(
        cfg, lambda c, p: run_path(c, p, has_gpu=False), batch_given=True, log=said.append, confirm=0
    )
    assert set(figures["failed"]) == {"python-queue"}, said
    assert "corrupt record 9" in figures["failed"]["python-queue"]
    assert any("python-queue: the probe at" in s and "running it once more" in s for s in said), said
    assert "python-queue" not in results
    cap = results["cpu"]["capacity"]
    assert cap["probes"] and agrees_with_its_probes(cap, 1) == []
    assert results[BASELINE]["capacity"]["failed"] == figures["failed"]
    assert "python-queue: no capacity, its probe failed twice: " in table(results)


def _rows(out) -> dict[str, dict]:
    with open(out / "results.csv") as f:
        return {r["path"]: r for r in csv.DictReader(f)}


def test_capacity_results_are_written_whole_and_an_earlier_set_is_kept(bad, tmp_path):
    out = tmp_path / "results"
    # 1. A run whose only path crashes: exit 2 with one line naming it, and the baseline's results written.
    code, text, err = finish(
        start("bench_input.py", "--find-capacity", *QUICK, "--fake-location", "python-queue", "--loader", bad,
              "--out", str(out)),
        300,
    )  # fmt: skip
    assert code == 2, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: python-queue: no capacity, its probe failed twice:")
    assert "corrupt record 9" in errors[0] and "Traceback" not in err
    first = json.loads((out / "results.json").read_text())
    assert set(first["capacity"]) == {BASELINE} and "python-queue" in first["capacity"][BASELINE]["failed"]
    # 2. A capacity run into the same folder: its capacity in results.md and .csv, the first run's files kept.
    code, text, err = finish(
        start("bench_input.py", "--find-capacity", *QUICK, "--fake-location", "cpu", "--out", str(out)), 300
    )
    assert code == 0, err[-3000:]
    doc = json.loads((out / "results.json").read_text())
    cap = doc["capacity"]["cpu"]
    assert agrees_with_its_probes(cap, 1) == [], cap["probes"]
    row = _rows(out)["cpu"]
    assert float(row["capacity_devices"]) == pytest.approx(cap["devices"])
    if cap["images_per_sec"] is not None:
        assert float(row["capacity_images_per_sec"]) == pytest.approx(cap["images_per_sec"])
        assert f"{cap['images_per_sec']:,.0f}" in (out / "results.md").read_text()
    assert "capacity img/s (interval)" in (out / "results.md").read_text()
    assert not (out / "capacity.png").exists()  # results.png is the capacity chart
    # The verdict under the capacity table is the capacity's own probe's: it never asks for a capacity search.
    assert "--find-capacity) to see where it stops keeping up" not in text
    if cap.get("bracket_per_device") and "cpu: not input-bound" in text:
        assert "this is the capacity's own probe" in text, text[-3000:]
    (kept,) = (out / "earlier").iterdir()
    assert json.loads((kept / "results.json").read_text()) == first
    assert sorted(os.listdir(kept)) == [
        "results.csv",
        "results.json",
        "results.md",
        "results.png",
        "timeline.json",
        "timeline.png",
    ]
    assert f"wrote {kept}{os.sep} (the earlier results that were in {out}, kept)" in text
