"""Telemetry measures outside the timed steps: its CPU snapshots are taken between steps, never inside the first
timed step (where they would slow the window they measure). Real TensorFlow session hooks, in the order the
TensorFlow trainer registers them (the step timer first)."""

from __future__ import annotations

from frameworks.tf_env import import_tf
from harness.tf.measure import StepTimer
from harness.tf.telemetry import CpuUse

tf = import_tf()


def _steps(warmup: int, total: int) -> tuple[StepTimer, CpuUse]:
    from tensorpack.callbacks.hooks import CallbackToHook

    graph = tf.Graph()
    with graph.as_default():
        loss = tf.reduce_sum(tf.random.uniform([64]))
        timer, cpu = StepTimer(), CpuUse(warmup, total)
        timer._cost = loss  # what its _setup_graph takes from the graph's cost collection
        cpu.before_train()
        with tf.compat.v1.train.MonitoredSession(hooks=[CallbackToHook(timer), CallbackToHook(cpu)]) as s:
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
    import time

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
