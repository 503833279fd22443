"""Time every training step from inside the session run, and turn step times into figures.

DLPerf / tf_cnn_benchmarks method: skip the warm-up steps, then time
`repeats` windows of `steps` steps; images/s per window is the window's
images over its wall time, reported as median with min and max. Steps that
measure something else (traces, profiles) run between and after the windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
from tensorpack.callbacks import Callback

from frameworks.tf_env import import_tf
from harness.schedule import Schedule
from profiler.progress import RunProgress
from profiler.summary import Summary
from profiler.training import training_block
from profiler.uncertainty import STEP_BATCHES, window_rate

tf = import_tf()


COST_COLLECTION = "feedbench_cost"  # the first tower's loss, put there by harness.tf.run


class StepTimer(Callback):
    """Records each step's start and end, and fetches the loss so its finiteness can be checked.

    It is the run's only measuring hook in every step. What else measures the
    run (telemetry, CPU snapshots) is a sampler it calls only in the steps the
    sampler names (harness/tf/telemetry.py): `steps_with()`, untimed steps it
    adds fetches or a trace to (`before_step`), and `steps_after()`, steps after
    whose end, the clock read, it takes a snapshot (`after_step`). A timed step
    pays two dict lookups, the same with telemetry on or off, and no hook of theirs.
    A sampler is a Callback whose `setup_graph` and `before_train` this calls.
    """

    def __init__(self, samplers: Sequence[Callback] = ()) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.losses: list[float] = []
        self.samplers = list(samplers)
        self._with: dict[int, list[Callback]] = {}  # step: the samplers that add to it
        self._after: dict[int, list[Callback]] = {}  # step: the samplers that read after it

    def _setup_graph(self) -> None:
        self._cost = tf.compat.v1.get_collection(COST_COLLECTION)[0]
        self._plain = tf.compat.v1.train.SessionRunArgs(fetches=self._cost)
        for s in self.samplers:
            s.setup_graph(self.trainer)

    def _before_train(self) -> None:
        for s in self.samplers:
            s.before_train()
            for step in s.steps_with():
                self._with.setdefault(step, []).append(s)
            for step in s.steps_after():
                self._after.setdefault(step, []).append(s)

    def _before_run(self, ctx):
        self.starts.append(time.perf_counter())
        here = self._with.get(len(self.starts) - 1)
        if here is None:
            return self._plain
        fetches, options = {"loss": self._cost}, None
        for i, s in enumerate(here):
            args = s.before_step(len(self.starts) - 1, ctx)
            if args is not None:
                fetches[i] = args.fetches
                options = options or args.options  # one sampler traces (Telemetry), the rest only fetch
        return tf.compat.v1.train.SessionRunArgs(fetches=fetches, options=options)

    def _after_run(self, ctx, values) -> None:
        self.ends.append(time.perf_counter())
        step = len(self.ends) - 1
        here, after = self._with.get(step), self._after.get(step)
        if here is None:
            self.losses.append(float(values.results))
        else:
            self.losses.append(float(values.results["loss"]))
            for i, s in enumerate(here):
                s.after_step(step, ctx, values._replace(results=values.results.get(i)))
        for s in after or ():
            s.after_step(step, ctx, values._replace(results=None))


def summarize(
    timer: StepTimer, schedule: Schedule, images_per_step: int, towers: int, loss_scale: float | None = None
) -> dict:
    """Figures for one path from its timed windows: images/s (total and per device), step-time percentiles.

    Only the windows' steps count (see harness/schedule.py); the untimed
    telemetry and profiler steps between and after them do not.
    """
    needed = schedule.total
    if len(timer.ends) < needed:
        raise RuntimeError(f"only {len(timer.ends)} of {needed} steps ran")
    rates = []
    measured = []
    for r in range(schedule.repeats):
        w = schedule.window(r)
        wall = timer.ends[w[-1]] - timer.starts[w[0]]
        rates.append(window_rate(schedule.steps * images_per_step, wall, schedule.steps, need=STEP_BATCHES))
        measured.extend(timer.ends[i] - timer.starts[i] for i in w)
    if None in rates:
        raise RuntimeError(f"a timed window measured no time ({schedule.steps} steps)")
    total = Summary.of(rates)
    losses = timer.losses[:needed]
    return {
        "images_per_sec": total.to_dict(),
        "images_per_sec_per_device": total.scaled(1 / towers).to_dict(),
        "step_time_ms": {
            "p50": float(np.percentile(measured, 50) * 1e3),
            "p90": float(np.percentile(measured, 90) * 1e3),
            "p99": float(np.percentile(measured, 99) * 1e3),
        },
        "final_loss": losses[-1],
        "loss_finite": all(math.isfinite(x) for x in losses),
        # A static loss scale (`loss_scale`, float16) applies every update: no step is skipped.
        "training": training_block(
            losses, [schedule.window(r) for r in range(schedule.repeats)], loss_scale=loss_scale
        ),
        "steps_run": len(timer.ends),
        "schedule": schedule.to_dict(),
        # For the run's timeline (profiler/timeline.py), which takes it out of the result.
        "clock": {
            "step_ends": list(timer.ends),
            "images_per_step": images_per_step,
            "windows": [[timer.starts[w[0]], timer.ends[w[-1]]] for w in map(schedule.window, range(schedule.repeats))],
        },
    }


class Progress(Callback):
    """The run's progress bar (profiler/progress.py), stepped by the training loop."""

    def __init__(self, progress: RunProgress) -> None:
        self.progress = progress

    def _before_train(self) -> None:
        self.progress.begin()

    def _trigger_step(self) -> None:
        self.progress.step()

    def _after_train(self) -> None:
        self.progress.end()
