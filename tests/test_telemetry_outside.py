"""Telemetry measures outside the timed steps: its CPU snapshots are taken between steps, never inside the first
timed step (where they would slow the window they measure), and a timed step runs the same code with telemetry
on as off. Real TensorFlow session hooks and real runs of the TensorFlow trainer."""

from __future__ import annotations

import os
import sys
import time

from conftest import ROOT
from tensorpack.callbacks import Callback

from core.config import BenchConfig, apply_defaults
from frameworks.tf_env import import_tf
from harness.tf.measure import StepTimer
from harness.tf.telemetry import CpuUse

tf = import_tf()


def _steps(warmup: int, total: int) -> tuple[StepTimer, CpuUse]:
    from tensorpack.callbacks.hooks import CallbackToHook

    graph = tf.Graph()
    with graph.as_default():
        loss = tf.reduce_sum(tf.random.uniform([64]))
        cpu = CpuUse(warmup, total)
        timer = StepTimer([cpu])  # the trainer's: CPU use is the timer's sampler, no hook of its own
        timer._cost = loss  # what its _setup_graph takes from the graph's cost collection
        timer._plain = tf.compat.v1.train.SessionRunArgs(fetches=loss)
        timer.before_train()
        with tf.compat.v1.train.MonitoredSession(hooks=[CallbackToHook(timer)]) as s:
            for _ in range(total):
                s.run(loss)
    return timer, cpu


def test_the_cpu_snapshots_are_taken_outside_the_timed_steps():
    warmup, total = 3, 10
    timer, cpu = _steps(warmup, total)
    assert len(timer.starts) == total
    assert timer.ends[warmup - 1] <= cpu._a.at < timer.starts[warmup]  # after the warm-up, before the first timed
    assert cpu._b.at >= timer.ends[-1]
    assert cpu.summary()["steps"] == total - warmup


def test_without_a_warm_up_the_first_snapshot_comes_before_the_first_step():
    timer, cpu = _steps(0, 4)
    assert cpu._a.at < timer.starts[0] and cpu._b.at >= timer.ends[-1]


def test_the_live_status_is_asked_for_twice_a_second_not_every_step(monkeypatch):
    """On a terminal the progress bar shows the telemetry's status: computing it every step of a 1 ms step
    would cost the steps it reports on."""
    from profiler import progress

    monkeypatch.setattr(progress, "interactive", lambda: True)
    asked = []
    bar = progress.RunProgress("gpu", 0, 2000, status=lambda: asked.append(1) or "status")
    bar.begin()
    t0 = time.monotonic()
    for _ in range(2000):
        bar.step()
    elapsed = time.monotonic() - t0
    bar.end()
    assert 1 <= len(asked) <= 1 + elapsed / progress.STATUS_EVERY_S + 1, (len(asked), elapsed)


class CallsInSteps(Callback):
    """Records every call of the project's own Python code on the training thread, with the time it was made."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []
        venv = os.path.join(str(ROOT), ".venv")

        def profile(frame, event, arg) -> None:
            code = frame.f_code
            if event == "call" and code.co_filename.startswith(str(ROOT)) and not code.co_filename.startswith(venv):
                where = os.path.relpath(code.co_filename, ROOT)
                self.calls.append((time.perf_counter(), f"{where}:{code.co_qualname}"))

        self._profile = profile

    def _before_train(self) -> None:
        sys.setprofile(self._profile)

    def _after_train(self) -> None:
        sys.setprofile(None)


def _in_timed_windows(telemetry: bool) -> set[str]:
    """The project's functions called inside a real run's timed windows (the `gpu` path, input only)."""
    from harness.tf.run import run_path

    cfg = BenchConfig(
        batch=2, image_size=32, num_gpus=1, warmup_steps=2, steps=12, repeats=2, input_only=True, telemetry=telemetry
    )
    apply_defaults(cfg, gpus=0)
    calls = CallsInSteps()
    windows = run_path(cfg, "gpu", has_gpu=False, extra_callbacks=[calls])["clock"]["windows"]
    assert len(windows) == 2
    return {name for t, name in calls.calls if any(a <= t <= b for a, b in windows)}


def test_a_timed_step_runs_the_same_code_with_telemetry_on_as_off(monkeypatch):
    """Telemetry samples in untimed steps: none of its code (its hooks, the CPU snapshots) runs in a timed
    step, where each call would add to the steps it reports on. Observed through real runs, both ways, without
    a terminal (on one, the progress bar asks for the telemetry's status twice a second: docs/profiling.md)."""
    from profiler import progress

    monkeypatch.setattr(progress, "interactive", lambda: False)
    on, off = _in_timed_windows(True), _in_timed_windows(False)
    assert any(name.startswith("harness/tf/measure.py:StepTimer") for name in off)  # the profile saw the steps
    assert on == off, f"with telemetry on only: {sorted(on - off)}; off only: {sorted(off - on)}"
