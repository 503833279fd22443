"""A model that does not train gives no figure: per-window loss, loss scale and skipped updates, and every reader
of a result (table, verdict, JSON, `make gpu-check`, `profiler.compare`) refusing a result marked invalid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from profiler.training import (
    invalid_reason,
    merge_ranks,
    skipped_steps,
    training_block,
    warmup_factor,
)

NAN = float("nan")
WINDOWS = [range(2, 4), range(4, 6)]  # 2 warm-up steps, 2 windows of 2 steps


def test_the_learning_rate_warms_up_linearly_over_the_warmup_steps_then_stays():
    assert [warmup_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0


def test_a_finite_run_is_valid_and_says_each_windows_loss():
    block = training_block([7.0, 6.9, 6.8, 6.7, 6.6, 6.5], WINDOWS)
    assert block["invalid"] is None and block["first_non_finite_step"] is None
    assert [w["loss_finite"] for w in block["windows"]] == [True, True]
    assert [w["skipped_steps"] for w in block["windows"]] == [0, 0]


def test_a_non_finite_loss_names_its_step_counted_from_one():
    block = training_block([7.0, 6.9, 6.8, NAN, NAN, NAN], WINDOWS)
    assert block["invalid"] == "loss non-finite from step 4"
    assert [w["loss_finite"] for w in block["windows"]] == [False, False]


def test_a_loss_gone_non_finite_in_the_warmup_marks_the_timed_windows():
    assert training_block([7.0, NAN, NAN, NAN, NAN, NAN], WINDOWS)["invalid"] == "loss non-finite from step 2"


def test_a_non_finite_warmup_loss_that_recovered_leaves_the_run_valid():
    # A scaler finding its scale in the first steps skips them: not a timed step, not the user's training.
    assert training_block([NAN, 6.9, 6.8, 6.7, 6.6, 6.5], WINDOWS)["invalid"] is None


def test_a_dynamic_scalers_skipped_timed_step_is_counted_with_its_scale():
    scales = [32768.0, 32768.0, 32768.0, 16384.0, 16384.0, 16384.0]  # the first step and step 4 skipped
    skipped = skipped_steps(scales, 65536.0)
    assert skipped == [True, False, False, True, False, False]
    block = training_block([7.0, 6.9, 6.8, 6.7, 6.6, 6.5], WINDOWS, scales, skipped)
    assert [w["skipped_steps"] for w in block["windows"]] == [1, 0]
    assert [w["loss_scale"] for w in block["windows"]] == [16384.0, 16384.0]
    assert block["first_skipped_step"] == 4
    assert block["invalid"] == (
        "1 timed step(s) skipped their update (non-finite gradients at loss scale 16384), the first at step 4"
    )


def test_a_non_finite_loss_whose_step_was_skipped_says_both():
    scales = [65536.0, 65536.0, 65536.0, 32768.0, 16384.0, 8192.0]
    block = training_block([7.0, 6.9, 6.8, NAN, NAN, NAN], WINDOWS, scales, skipped_steps(scales, 65536.0))
    assert block["invalid"] == "loss non-finite from step 4; the step skipped its update"


def test_one_invalid_rank_makes_the_run_invalid_and_is_named():
    good = training_block([7.0] * 6, WINDOWS)
    bad = training_block([7.0, 6.9, 6.8, NAN, NAN, NAN], WINDOWS)
    merged = merge_ranks([good, bad])
    assert merged["invalid"] == "rank 1: loss non-finite from step 4"
    assert [w["loss_finite"] for w in merged["windows"]] == [False, False]
    assert merge_ranks([good, good])["invalid"] is None


# ------------------------------------------------------- every reader of a result refuses an invalid one


def _results(invalid: str | None) -> dict[str, dict]:
    """A baseline and a path, each with 3 windows, the path's model diverged when `invalid` is given."""

    def one(rates: list[float], block: dict) -> dict:
        return {
            "images_per_sec": {"median": sorted(rates)[1], "min": min(rates), "max": max(rates), "repeats": rates},
            "images_per_sec_per_device": {"median": sorted(rates)[1], "min": min(rates), "max": max(rates)},
            "step_time_ms": {"p50": 40.0, "p90": 41.0, "p99": 42.0},
            "final_loss": 6.0,
            "loss_finite": block["invalid"] is None,
            "training": block,
            "telemetry": {"input_wait_share": 0.0},
        }

    good = training_block([7.0] * 6, WINDOWS)
    bad = training_block([7.0, 6.9, 6.8, NAN, NAN, NAN], WINDOWS) if invalid else good
    return {"gpu": one([3000.0, 3010.0, 2990.0], good), "python-queue": one([2990.0, 3000.0, 2995.0], bad)}


def test_the_table_gives_an_invalid_path_no_figure_and_says_why():
    from profiler.report import add_ratios, table

    results = _results("diverged")
    add_ratios(results)
    (row,) = [ln for ln in table(results, 1, False).splitlines() if ln.startswith("python-queue")]
    assert "no figure" in row and "invalid: loss non-finite from step 4" in row
    assert "2,995" not in row and "1.00" not in row
    valid = _results(None)
    add_ratios(valid)
    assert "invalid" not in table(valid, 1, False)


def test_the_verdict_of_an_invalid_path_says_invalid_from_which_step():
    from profiler.report import add_ratios
    from profiler.verdict import add_verdicts, line

    results = _results("diverged")
    add_ratios(results)
    add_verdicts(results, "torch")
    v = results["python-queue"]["verdict"]
    assert v["level"] == "invalid" and results["python-queue"]["attribution"] is None
    assert line("python-queue", v).startswith("python-queue: invalid — loss non-finite from step 4; ")
    assert results["gpu"]["verdict"]["level"] != "invalid"


def test_gpu_check_fails_on_an_invalid_result():
    from benchmarks.gpu_check import figure_problems

    assert figure_problems("PyTorch", _results(None), "NVIDIA H200") == []
    assert figure_problems("PyTorch", _results("diverged"), "NVIDIA H200") == [
        "PyTorch: python-queue: invalid: loss non-finite from step 4"
    ]


def test_gpu_check_refuses_the_h200_run_whose_every_resnet_path_trained_a_nan_loss():
    """docs/gpu-runs/2026-11-26-h200: `loss_finite: false` on every path, which nothing read then."""
    from benchmarks.gpu_check import _results as read
    from benchmarks.gpu_check import figure_problems

    results = read(str(ROOT / "docs/gpu-runs/2026-11-26-h200/headline.json"))
    problems = figure_problems("PyTorch", results, "NVIDIA H200")
    assert problems == [f"PyTorch: {p}: invalid: loss non-finite" for p in results]


def test_compare_refuses_an_invalid_result_naming_file_and_path(procs, tmp_path: Path):
    """The H200 run (every ResNet-50 path's loss NaN) against itself made valid: refused, exit 2, one line."""
    h200 = ROOT / "docs/gpu-runs/2026-11-26-h200/headline.json"
    doc = json.loads(h200.read_text())
    for r in doc["paths"].values():
        r["loss_finite"] = True
    (old := tmp_path / "old.json").write_text(json.dumps(doc))
    p = procs.start("-m", "profiler.compare", str(old), str(h200))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2, (out, err)
    assert err.strip().splitlines() == [
        f"error: {h200}: paths.gpu: invalid: loss non-finite; a model that does not train gives no figure"
    ]
    p = procs.start("-m", "profiler.compare", str(old), str(old))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err


def test_a_result_written_before_the_training_block_is_judged_by_loss_finite():
    assert invalid_reason({"loss_finite": False}) == "loss non-finite"
    assert invalid_reason({"loss_finite": True}) is None


# ---------------------------------------------------------------- both trainers, on this machine's CPU

TINY = ["--fake-location", "gpu", "--num-gpus", "1", "--batch", "2", "--image-size", "32",
        "--warmup-steps", "2", "--steps", "2", "--repeats", "2"]  # fmt: skip


@pytest.mark.timeout(400)
@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_a_run_made_to_diverge_is_flagged_and_exits_3(procs, tmp_path, framework):
    if framework == "torch":
        pytest.importorskip("torch")
    out = tmp_path / "r.json"
    p = procs.start("bench_input.py", "--framework", framework, *TINY, "--learning-rate", "1e6", "--json", str(out))
    stdout, err = p.communicate(timeout=380)
    assert p.returncode == 3, err[-2000:]
    r = json.loads(out.read_text())["paths"]["gpu"]
    assert r["training"]["invalid"].startswith("loss non-finite from step ")
    # When it diverges varies with the initial weights (a loss of 3e22 is still finite): from then on, each
    # window is marked, the last one at least.
    first = r["training"]["first_non_finite_step"]
    assert not r["training"]["windows"][-1]["loss_finite"] and f"from step {first}" in r["training"]["invalid"]
    assert "no figure" in stdout and "gpu: invalid — loss non-finite from step" in stdout
    assert [ln for ln in err.splitlines() if ln.startswith("error")] == [
        f"error: gpu: invalid: {r['training']['invalid']}: its figures are not reported"
    ]


def test_fused_sgd_under_a_grad_scaler_steps_as_plain_sgd_when_its_first_steps_are_skipped():
    """The cause of every non-finite ResNet-50 loss on the H200 (2026-11-26 and 28): a fused SGD whose first steps
    a GradScaler skipped (a float16 run's first steps overflow while the scaler finds its scale) made its momentum
    buffers from uninitialized memory, and its first update threw the weights to 1e24 or beyond. The trainer's
    optimizer (harness/torch/run.py `sgd`), fused on this CPU as on a GPU, takes the same steps as plain SGD."""
    torch = pytest.importorskip("torch")
    from harness.torch.run import sgd

    def train(fused: bool) -> list:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = sgd(model.parameters(), 0.1, fused)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        assert getattr(opt, "_step_supports_amp_scaling", False) == fused  # the scaler hands the fused kernel its skip
        x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
        for step in range(8):
            loss = torch.nn.functional.cross_entropy(model(x), y) * (1e36 if step < 2 else 1.0)  # 2 overflowing
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        assert scaler.get_scale() == 2.0**14  # the first two steps were skipped
        return [p.detach().clone() for p in model.parameters()]

    plain, fused = train(False), train(True)
    assert all(torch.isfinite(p).all() for p in fused)
    # The same steps, but for float rounding (the fused kernel unscales inside the update).
    diffs = [float((a - b).abs().max()) for a, b in zip(plain, fused)]
    assert max(diffs) < 1e-6, diffs
