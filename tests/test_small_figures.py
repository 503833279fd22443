"""Small figures with their noise: a saving from a few epochs and the slowest of two close stages are told only
when their own samples tell them apart, and otherwise say that they cannot."""

from __future__ import annotations

import random
import time

import jsonschema
from schema import SCHEMA

from core.loader_stages import profile_dataset, tied_with_slowest
from profiler import epoch_report, tune_report
from profiler.loader_report import stages_text


def check_at(part: dict, pointer: str) -> None:
    """Check a block against the schema's part at `pointer` (a JSON pointer into docs/results.schema.json)."""
    schema = {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": pointer}
    jsonschema.Draft202012Validator(schema).validate(part)


def _run(persistent: bool, first_batches: list[float]) -> dict:
    """One run's figures as epoch_report.run_figures gives them: only what `saving` reads."""
    epochs = [{"epoch": k + 1, "first_batch_s": t} for k, t in enumerate(first_batches)]
    return {"persistent_workers": persistent, "epochs": epochs}


def test_one_pair_of_later_epochs_tells_no_saving():
    """Epochs 1-2: one later epoch each way has no spread, so 0.92 s is no saving to report."""
    s = epoch_report.saving([_run(False, [1.5, 1.03]), _run(True, [1.5, 0.11])])
    assert s["interval_s"] is None and not s["told_apart"] and s["confidence"] == 0
    check_at(s, "#/$defs/loader_epochs/properties/persistent_workers_saving")
    words = epoch_report.saving_words(s)
    assert "cannot be told" in words and "saves" not in words and "--epochs 4" in words


def test_a_saving_within_the_epochs_noise_is_not_told():
    s = epoch_report.saving([_run(False, [2.0, 0.30, 1.20, 0.10]), _run(True, [2.0, 0.25, 0.90, 0.35])])
    lo, hi = s["interval_s"]
    assert lo < 0 < hi and not s["told_apart"]
    assert lo <= s["saves_s"] <= hi  # the figure lies inside its own interval
    words = epoch_report.saving_words(s)
    assert "no saving told apart from the noise" in words and "saves" not in words


def test_a_saving_every_epoch_shows_is_told_with_its_interval():
    s = epoch_report.saving([_run(False, [5.0, 4.98, 4.28, 4.70]), _run(True, [5.1, 0.10, 0.12, 0.09])])
    lo, hi = s["interval_s"]
    assert 0 < lo <= s["saves_s"] <= hi and s["told_apart"] and s["confidence"] == 0.9
    check_at(s, "#/$defs/loader_epochs/properties/persistent_workers_saving")
    assert epoch_report.saving_words(s).startswith(f"persistent_workers=True saves {s['saves_s']:.2f} s (interval")


def _noisy(mean: float, rng: random.Random, n: int = 200) -> list[float]:
    return [mean * rng.lognormvariate(0, 0.3) for _ in range(n)]


def test_two_stages_within_their_noise_tie_for_the_slowest():
    """RandomResizedCrop at 44.4 % beside decode at 44.2 % of 200 noisy samples: a tie, not a limit."""
    rng = random.Random(7)
    per = {"read": _noisy(0.05e-3, rng), "decode": _noisy(0.884e-3, rng), "RandomResizedCrop": _noisy(0.888e-3, rng)}
    tied = tied_with_slowest(per)
    assert set(tied) == {"decode", "RandomResizedCrop"}
    per["RandomResizedCrop"] = [t * 1.5 for t in per["RandomResizedCrop"]]  # clearly slower: no tie
    assert tied_with_slowest(per) == ["RandomResizedCrop"]


class _Spin:
    """A transform step that keeps the CPU busy for `seconds` and returns its input."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, x):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return x


class _Dataset:
    def __init__(self, steps: list) -> None:
        self.transform = list(steps)

    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int):
        x = i
        for step in self.transform:
            x = step(x)
        return x


def test_the_stage_table_and_the_tune_limit_say_a_tie_when_the_stages_tie():
    """Per-sample times from a real dataset's timed steps: a stage 20x the other is the limit; a tie is said."""
    st = profile_dataset(_Dataset([_Spin(2e-3), _Spin(0.1e-3)]), "spin", samples=40, seconds=1.0)
    assert st["tied_with_slowest"] == [] and st["slowest"].startswith("_Spin (")
    stages = {
        "stages": [
            {"name": "decode", "seconds_per_sample": 0.884e-3, "share": 0.442},
            {"name": "RandomResizedCrop", "seconds_per_sample": 0.888e-3, "share": 0.444},
        ],
        "tied_with_slowest": ["decode"],
        "shares_sum": 0.886,  # what the stages explain of a sample's 2.0 ms (core/loader_stages.py)
        "seconds_per_sample": 2.0e-3,
    }
    limit = tune_report._limit({"cpu_cores": 1.9}, stages, 2)
    check_at(limit, "#/$defs/loader_tune/properties/shortfall/oneOf/1/properties/limit")
    words = tune_report._limit_words(limit, 2)
    assert "RandomResizedCrop (44.4%) and decode (44.2%)" in words and "a tie" in words
    assert "the limit is the stage" not in words
    assert "a tie" in stages_text({**st, "slowest": "a (44.4%) and b (44.2%) of a sample: a tie"})


def test_the_first_batch_line_says_what_each_path_spans():
    """The baseline's 25.78 s on TensorFlow is the model's start-up (no input); on PyTorch the model is not in it."""
    from profiler.first_batch import figure, line

    tf = {
        "gpu": {"first_batch": figure("tf", 25.78, parts={"to_first_step_s": 3.1, "first_step_s": 22.68})},
        "zmq-consume": {"first_batch": figure("tf", 27.0, parts={"to_first_step_s": 3.0, "first_step_s": 24.0})},
    }
    words = line(tf)
    assert (
        "gpu 25.78 s (3.10 s to its first step, the session made; first step 22.68 s: the model's start-up alone, no input to "
        "wait for)" in words
    )
    assert (
        "zmq-consume 27.00 s (3.00 s to its first step, the input started and the session made; first step 24.00 s)"
        in words
    )
    assert words.endswith("each figure spans the model's start-up (the session, the first step's graph optimisation "
                          "and memory) and the input's first batch")  # fmt: skip
    for r in tf.values():
        check_at(r["first_batch"], "#/$defs/path_result/properties/first_batch")
    torch = {
        "gpu": {"first_batch": figure("torch", 0.02, [0.02])},
        "spdl": {"first_batch": figure("torch", 7.3, [7.3])},
    }
    words = line(torch)
    assert "gpu 0.02 s (its batch is made on the device: no input to wait for)" in words
    assert words.endswith("each figure spans the input's first batch only (the model was built and placed before)")
