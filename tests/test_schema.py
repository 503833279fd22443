"""One JSON schema for both trainers: real reports of every path, a sweep and a capacity run, validated.

The schema (docs/results.schema.json) is the contract a user's scripts read;
these runs are short but real (producers, sockets, the trainers' own loops).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUICK_PROBE_FLAGS
from path_lists import default_paths
from schema import SCHEMA, check_report

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--input-only", "--batch", "4", "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2"]


def bench(tmp_path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench_input.py"), *args], cwd=tmp_path, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_the_schema_is_itself_valid_and_versioned():
    import jsonschema

    from profiler.report import SCHEMA_VERSION

    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["schema_version"]["const"] == SCHEMA_VERSION


@pytest.fixture(scope="module", params=["tf", "torch"])
def default_run(request, tmp_path_factory) -> tuple[str, dict, str, float]:
    """(framework, JSON report, stdout, seconds the run took) of every default path, tiny sizes."""
    import time

    tmp_path = tmp_path_factory.mktemp(f"default-{request.param}")
    t0 = time.time()
    p = bench(tmp_path, "--framework", request.param, *SMALL, "--json", "run.json")
    return request.param, json.loads((tmp_path / "run.json").read_text()), p.stdout, time.time() - t0


def test_every_default_path_of_each_trainer_matches_the_schema(default_run):
    framework, doc, _, _ = default_run
    check_report(doc)
    assert doc["framework"] == framework and doc["config"]["framework"] == framework
    assert set(doc["paths"]) == set(default_paths(framework))
    for name, r in doc["paths"].items():
        assert r["input"]["name"] == name  # the same fields, meaning the same thing, in both trainers
        assert r["schedule"]["timed_windows"] == 2 and r["schedule"]["timed_steps_per_window"] == 3
        assert r["batch"] == 4 and r["bytes_per_image"] == 32 * 32 * 3 + 4
    assert doc["model"] == {"emulated": False, "name": "ResNet-50", "version": "1.5", "input_only": True}


def test_every_path_of_each_trainer_reports_its_time_to_the_first_batch(default_run):
    """Each path's first batch, in the JSON and under the table: positive, within the run, between named events."""
    from profiler.first_batch import END, SPANS, START

    framework, doc, stdout, wall = default_run
    line = next(ln for ln in stdout.splitlines() if ln.startswith("first batch, from "))
    for name, r in doc["paths"].items():
        fb = r["first_batch"]
        assert 0 < fb["seconds"] < wall, (name, fb)
        assert (fb["from"], fb["to"], fb["spans"]) == (START, END[framework], SPANS[framework])
        assert f"{name} {fb['seconds']:.2f} s" in line, line
        if framework == "torch":  # the path's figure is the slowest rank's
            assert fb["per_rank_s"] == [rank["first_batch_s"] for rank in r["ranks"]]
            assert max(fb["per_rank_s"]) == fb["seconds"] and min(fb["per_rank_s"]) > 0
        else:  # the session, then the first step: the two add up to the figure
            parts = fb["parts"]
            assert parts["to_first_step_s"] + parts["first_step_s"] == pytest.approx(fb["seconds"])
    assert line.startswith(f"first batch, from {START} to {END[framework]}: ")
    assert "no input to wait for" in line and line.endswith(f"each figure spans {SPANS[framework]}")


def test_a_sweep_matches_the_schema(tmp_path):
    bench(tmp_path, "--sweep", "--fake-location", "zmq-consume", *SMALL[:1], "--batch", "2,4", *SMALL[3:],
          "--out", "out")  # fmt: skip
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    check_report(doc)
    assert [(r["path"], r["batch"]) for r in doc["rows"]] == [("gpu", 2), ("zmq-consume", 2), ("gpu", 4),
                                                              ("zmq-consume", 4)]  # fmt: skip


@pytest.mark.timeout(900)  # a torchrun launch per probe: minutes on one core
def test_a_torch_capacity_run_against_emulated_h100s_matches_the_schema(tmp_path):
    """--framework torch --find-capacity --emulate H100, end to end: each path's capacity, labelled as emulated."""
    p = bench(tmp_path, "--framework", "torch", "--find-capacity", "--emulate", "H100", "--fake-location",
              "zmq-consume", "--num-gpus", "1", "--image-size", "32", "--capacity-tries", "0", "--capacity-probes", "2",
              *QUICK_PROBE_FLAGS,
              "--json", "cap.json", "--out", "out")  # fmt: skip
    doc = json.loads((tmp_path / "cap.json").read_text())
    check_report(doc)
    assert doc["framework"] == "torch" and doc["model"]["emulated"] is True and doc["model"]["device"] == "H100"
    cap = doc["capacity"]
    assert set(cap) == {"gpu", "zmq-consume"}
    assert cap["zmq-consume"]["probes"], "the search probed the path"
    assert cap["zmq-consume"]["device"] == "H100" and cap["zmq-consume"]["device_images_per_sec"] == 7000
    assert "emulated H100" in p.stdout and "capacity img/s" in p.stdout
    assert (tmp_path / "out" / "results.png").stat().st_size > 0 and not (tmp_path / "out" / "capacity.png").exists()
    check_report(json.loads((tmp_path / "out" / "results.json").read_text()))


def test_interleave_measures_each_path_in_runs_alternating_with_the_baseline(tmp_path):
    """--interleave 2: two (baseline, path) pairs of one-window runs; the ratio and its interval come from them."""
    bench(tmp_path, "--fake-location", "zmq-consume", *SMALL, "--interleave", "2", "--json", "run.json")
    doc = json.loads((tmp_path / "run.json").read_text())
    check_report(doc)
    r = doc["paths"]["zmq-consume"]
    inter = r["interleaved"]
    assert inter["pairs"] == 2 and len(inter["ratios"]) == 2 and len(inter["baseline_images_per_sec"]) == 2
    assert all(p > 0 for p in inter["images_per_sec"] + inter["baseline_images_per_sec"])
    assert inter["ratios"] == [p / b for p, b in zip(inter["images_per_sec"], inter["baseline_images_per_sec"])]
    assert r["ratio_to_baseline"] == inter["ratio"]
    assert r["uncertainty"]["ratio_method"] == "alternating runs (2 pairs)"
    lo, hi = r["uncertainty"]["ratio"]
    assert lo <= min(inter["ratios"]) + 1e-12 and max(inter["ratios"]) - 1e-12 <= hi
    assert "interleaved" not in doc["paths"]["gpu"]
    # The gap the attribution splits is the ratio the table shows: the pairs', not the path's own run's.
    assert r["attribution"]["ratio"] == inter["ratio"] and r["attribution"]["ratio_interval"] == [lo, hi]
