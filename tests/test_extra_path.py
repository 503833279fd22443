"""Adding an input path is one class and nothing else: a path defined here runs through the real CLI.

The path below is registered by this module alone (no project module knows
it). The test runs this file as a script, which registers the path and then
calls `bench_input.main`, so the whole command line runs end to end: flags,
the gpu baseline, the new path, its own stage figures, the verdict, the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorpack.input_source import InputSource, TensorInput

from consumers.tf_half import TFInputPath, random_batch
from core.registry import register
from frameworks.tf_env import import_tf

tf = import_tf()
ROOT = Path(__file__).resolve().parent.parent
NAME = "constant-in-graph"


class CountingStage:
    """A stage of the new path's own: it counts the measured steps it was sampled in."""

    name = "constant"
    input_op_types = frozenset()

    def __init__(self) -> None:
        self.samples: list[int] = []

    def fetches(self):
        return tf.constant(7)

    def record(self, value) -> None:
        self.samples.append(int(value))

    def figures(self) -> dict:
        return {"samples": len(self.samples), "value": self.samples[-1] if self.samples else None}

    def live(self) -> str:
        return ""


@register
class ConstantInGraph(TFInputPath):
    name = NAME
    summary = "one random batch held as graph constants, staged onto each device (a test path)"
    order = 99
    in_default_run = False
    advice = "nothing to speed up: the batch is a constant"

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        arrays = random_batch(specs, seed=1)
        self.stage = CountingStage()
        return TensorInput(lambda: [tf.constant(a) for a in arrays])

    def sampled_stages(self) -> list:
        return [self.stage, *super().sampled_stages()]


def test_a_path_defined_outside_the_project_runs_through_the_cli(tmp_path):
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, __file__, "--fake-location", NAME, "--input-only", "--num-gpus", "2", "--batch", "2",
         "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"{NAME}: " in p.stdout  # its verdict line
    doc = json.loads(out.read_text())
    assert list(doc["paths"]) == ["gpu", NAME]
    r = doc["paths"][NAME]
    sched = r["schedule"]  # telemetry runs on untimed steps after each timed window
    assert sched["timed_windows"] == 2 and sched["timed_steps_per_window"] == 3
    assert r["steps_run"] == 1 + 3 * 2 + sched["untimed_steps"] and r["images_per_sec"]["median"] > 0
    assert r["ratio_to_baseline"] == pytest.approx(
        r["images_per_sec"]["median"] / doc["paths"]["gpu"]["images_per_sec"]["median"]
    )
    assert r["input"]["advice"] == ConstantInGraph.advice
    tel = r["telemetry"]
    assert tel["constant"]["value"] == 7 and tel["constant"]["samples"] >= 2  # its own stage, sampled per window
    assert tel["staging"]["towers"] == 2  # staged onto each of the two devices
    # "none": two short windows may not tell it from the baseline (profiler/uncertainty.py).
    assert r["verdict"]["limiting_stage"] in {"trainer", "input", "none", "unexplained"}


def test_the_new_path_is_listed_by_the_cli_help():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, __file__, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert p.returncode == 0
    assert NAME in p.stdout and ConstantInGraph.summary in " ".join(p.stdout.split())


if __name__ == "__main__":
    import bench_input

    sys.exit(bench_input.main(sys.argv[1:]))
