"""`bench_input.py --framework torch --profile DIR`: a torch.profiler trace per path and rank, with the input's
stages as named ranges, written after the timed windows so the windows keep their steps."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(400)

WARMUP, STEPS, REPEATS = 1, 2, 2
RANKS = 2


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> dict:
    """One two-rank run of python-queue (and the gpu baseline it brings) with --profile."""
    from conftest import Procs

    tmp = tmp_path_factory.mktemp("profile")
    out_json, logdir = tmp / "r.json", tmp / "traces"
    procs = Procs()
    try:
        p = procs.start(
            "bench_input.py", "--framework", "torch", "--profile", str(logdir), "--fake-location", "python-queue",
            "--num-gpus", str(RANKS), "--batch", "4", "--image-size", "32", "--warmup-steps", str(WARMUP),
            "--steps", str(STEPS), "--repeats", str(REPEATS), "--json", str(out_json),
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )  # fmt: skip
        out, err = p.communicate(timeout=360)
    finally:
        procs.cleanup()
    assert p.returncode == 0, err
    return {"out": out, "logdir": logdir, "doc": json.loads(out_json.read_text())}


def _names(trace: dict) -> list[str]:
    return [str(e.get("name", "")) for e in trace["traceEvents"]]


# The paths of the `profiled` run: the baseline and its --fake-location.
@pytest.mark.parametrize("path", ["gpu", "python-queue"])
def test_every_rank_writes_a_chrome_trace_with_the_input_and_the_step_as_ranges(profiled, path):
    from harness.torch.tracing import ACTIVE_STEPS, trace_file

    for rank in range(RANKS):
        trace = json.loads(open(trace_file(str(profiled["logdir"]), path, rank)).read())
        names = _names(trace)
        assert names.count(f"feedbench.input.{path}") == ACTIVE_STEPS
        assert names.count("feedbench.step") == ACTIVE_STEPS
        assert sum(n.startswith("ProfilerStep#") for n in names) == ACTIVE_STEPS  # TensorBoard's steps
        assert trace["distributedInfo"]["rank"] == rank  # its Distributed view tells the ranks apart
        if path == "python-queue":
            # The feeding thread's receive and pinned copy, and the step's wait for the prefetched batch.
            assert {"feedbench.receive", "feedbench.host_copy", "feedbench.wait"} <= set(names)


def test_only_whole_traces_are_left(profiled):
    files = sorted(str(f.relative_to(profiled["logdir"])) for f in profiled["logdir"].rglob("*") if f.is_file())
    want = [f"{path}/rank{r}.pt.trace.json" for path in ("gpu", "python-queue") for r in range(RANKS)]
    assert files == want
    assert f"profile: {profiled['logdir']}/gpu/rank0.pt.trace.json" in profiled["out"]


def test_the_timed_windows_keep_their_steps(profiled):
    doc = profiled["doc"]
    assert doc["config"]["steps"] == STEPS and doc["config"]["repeats"] == REPEATS
    for path in ("gpu", "python-queue"):
        r = doc["paths"][path]
        assert r["steps_run"] == WARMUP + STEPS * REPEATS  # the profiled steps are in no window
        assert r["batches_trained"] == RANKS * (WARMUP + STEPS * REPEATS)
        assert r["loss_finite"] and r["images_per_sec"]["median"] > 0


def test_stage_is_a_named_range_only_under_a_profiler():
    import torch

    from frameworks.torch_trace import stage

    assert type(stage("feedbench.x")).__name__ == "nullcontext"  # nothing recorded, nothing paid
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with stage("feedbench.x"):
            torch.ones(4).sum()
    assert "feedbench.x" in {e.name for e in prof.events()}


def test_how_to_open_names_both_viewers_and_what_they_need():
    from harness.torch.tracing import how_to_open

    text = how_to_open("/tmp/p")
    assert "ui.perfetto.dev" in text and "/tmp/p/<path>/rank<r>.pt.trace.json" in text
    assert "tensorboard --logdir /tmp/p" in text and "torch-tb-profiler" in text
