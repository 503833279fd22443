"""An --input-only figure is a path's ceiling only where its own consumer limits it; where its producers do, the
table prints it as a floor and says how to raise it (the H200 run's 37,056 images/s for zmq-consume)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

H200 = ROOT / "docs/gpu-runs/2026-11-26-h200/input_only.json"


@pytest.mark.parametrize("keep_verdicts", [True, False])
def test_a_producer_limited_input_only_figure_is_a_floor_not_a_ceiling(keep_verdicts):
    from profiler.report import add_ratios, table

    results = json.loads(H200.read_text())["paths"]
    if not keep_verdicts:  # the table judges the limit itself, as it does before the verdicts are printed
        for r in results.values():
            r.pop("verdict", None)
    add_ratios(results)
    rows = {ln.split()[0]: ln for ln in table(results, 1, True).splitlines()[2:7]}
    assert "≥ 37,056 (producers limit: add --producers)" in rows["zmq-consume"]
    assert "≥ 37,129 (producers limit: add --producers)" in rows["python-queue"]
    for path in ("gpu", "cpu", "python-dataset"):  # the baseline, and two paths their consumer limits
        assert "≥" not in rows[path] and "producers limit" not in rows[path]
    assert rows["python-dataset"].split()[1] == "17,754"


def test_a_window_far_above_the_producers_own_count_is_no_floor():
    """The second H200 run's zmq-consume ceiling (docs/gpu-runs/2026-11-28-h200/ceiling.json): 25-step windows
    over shm:// with 14 producers read 282,818 images/s, the producers' own count 37,518; the table printed
    "≥ 282,818 (producers limit)". Windows that only drained batches queued before them give no floor."""
    from profiler.report import add_ratios, table

    results = json.loads((ROOT / "docs/gpu-runs/2026-11-28-h200/ceiling.json").read_text())["paths"]
    add_ratios(results)
    rows = {ln.split()[0]: ln for ln in table(results, 1, True).splitlines()[2:4]}
    assert "not a rate: the windows drained a backlog (producers: 37,518); lengthen --steps" in rows["zmq-consume"]
    assert "≥" not in rows["zmq-consume"] and "282,818" not in rows["zmq-consume"]
    from profiler.verdict import add_verdicts

    add_verdicts(results, framework="torch")
    evidence = results["zmq-consume"]["verdict"]["evidence"]
    assert "the windows drained batches queued before them (not a rate: lengthen --steps)" in evidence, evidence


@pytest.mark.parametrize(
    ("module", "framework", "words"),
    [
        ("consumers.tf_data_service.path", "tf", "the service's workers limit: add --service-workers"),
        ("consumers.ray_data.path", "torch", "Ray's workers limit: raise --ray-cpus"),
        ("consumers.loader.path", "torch", "your loader limits: raise its workers"),
        ("consumers.zmq_consume.path", "torch", "producers limit: add --producers"),
    ],
)
def test_a_floor_says_how_to_raise_it_in_the_paths_own_terms(module, framework, words):
    """The floor's words come from the path's declaration through its result's `input` block: a tf.data
    service run limited by its workers was told to "add --producers", a flag that path does not read."""
    import importlib

    from core.config import BenchConfig
    from core.registry import InputPath
    from profiler.report import add_ratios, table

    half = type("Half", (InputPath,), {"declaration": importlib.import_module(module).PATH, "framework": framework})
    results = json.loads(H200.read_text())["paths"]
    results["zmq-consume"]["input"] = half(BenchConfig()).describe()  # that path's own words on a floor
    add_ratios(results)
    rows = {ln.split()[0]: ln for ln in table(results, 1, True).splitlines()[2:7]}
    assert f"≥ 37,056 ({words})" in rows["zmq-consume"], rows["zmq-consume"]
