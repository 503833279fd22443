"""Per-stage telemetry of one run, gathered outside the timed steps (the TensorFlow side).

Nothing here runs inside a timed window: after each window the run takes a
few untimed telemetry steps (as many as tracing every `sample_every`-th
timed step would give; harness/schedule.py), and those are the steps this
samples and traces. Input wait is measured from TensorFlow's own op timings:
a telemetry step runs with
`RunOptions(trace_level=FULL_TRACE)` and the step's `RunMetadata.step_stats`
give each op's start and end. The input ops (each path names its own: queue
dequeue, the zmq pull op, tf.data's IteratorGetNext, StagingArea unstage) are
the ones that block when no batch is ready. A step waits for input only while
such an op runs and no other op does: that *exposed* input time, over the
step's wall time, is the input share of the step (the TensorFlow profiler's
convention). Input ops that run in parallel with compute cost nothing.

Neither this nor CpuUse is a session hook of its own: the step timer
(harness/tf/measure.py) hands them only the steps they name, so a timed step
runs the same hooks with telemetry on as off.

This callback only gathers: each stage (the path's queue, the staging areas)
gives the tensors to fetch with every telemetry step and turns its samples
into its own figures; the path gives the wire's counters and its producers'
figures (profiler/telemetry.py computes the dicts). See docs/profiling.md.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from tensorpack.callbacks import Callback

from frameworks.tf_env import import_tf
from harness.schedule import Schedule
from profiler.telemetry import exposed_input_us, input_wait_figures, stage_figures

tf = import_tf()

# The stage names of the telemetry block, present (maybe None) in every result.
STAGES = ("queue", "staging", "wire", "producers")


class Telemetry(Callback):
    """Samples every stage and traces input wait in the schedule's telemetry steps, outside the timed windows.

    `path` is the run's TFInputPath: its `sampled_stages()`, `input_op_types`,
    `counters(session)` and `producer_figures(window)` are all this reads;
    profiler.telemetry.stage_figures turns them into figures, as for the PyTorch trainer.
    """

    def __init__(self, path, schedule: Schedule, images_per_step: int, sample_every: int = 4) -> None:
        self.path = path
        self.schedule = schedule
        self.images_per_step = images_per_step
        self.sample_every = max(1, sample_every)
        self.paused = False  # set by the profiler while its own trace runs (one trace at a time)
        self.traced: list[tuple[float, float]] = []  # (exposed input ms, step wall ms)
        self.recent: deque[float] = deque(maxlen=8)
        self._window: list[dict | None] = [None, None]

    def _setup_graph(self) -> None:
        self.stages = self.path.sampled_stages()
        types = set(self.path.input_op_types).union(*(getattr(s, "input_op_types", ()) for s in self.stages))
        graph = tf.compat.v1.get_default_graph()
        self.input_ops = {op.name for op in graph.get_operations() if op.type in types}
        self._fetches = {}
        for s in self.stages:
            with tf.name_scope("telemetry"):
                f = s.fetches()
            if f is not None:
                self._fetches[s.name] = f

    def _before_train(self) -> None:
        sched = self.schedule
        self._traced_steps = frozenset(i for i in range(sched.total) if sched.telemetry(i))
        self._snapshots = {sched.warmup - 1: 0}  # between the warm-up and the first window
        if sched.repeats:
            self._snapshots[sched.window(sched.repeats - 1)[-1]] = 1  # after the last window's last step
        if sched.warmup == 0:
            self._window[0] = self.path.counters(self.trainer.sess)

    def steps_with(self) -> frozenset[int]:
        """The telemetry steps, each traced and sampled (StepTimer hands them over: harness/tf/measure.py)."""
        return self._traced_steps

    def steps_after(self) -> set[int]:
        """The steps after which the wire's counters are read: the last warm-up step, the last timed step."""
        return set(self._snapshots) - self._traced_steps

    def before_step(self, step: int, ctx):
        self._t0 = time.perf_counter()
        options = None if self.paused else tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        return tf.compat.v1.train.SessionRunArgs(fetches=self._fetches, options=options)

    def after_step(self, step: int, ctx, values) -> None:
        slot = self._snapshots.get(step)
        if slot is not None:
            self._window[slot] = self.path.counters(ctx.session)
        if step not in self._traced_steps:
            return
        wall = time.perf_counter() - self._t0
        self.recent.append(wall)
        res = values.results or {}
        for s in self.stages:
            if s.name in res:
                s.record(res[s.name])
        if values.run_metadata is not None and values.run_metadata.step_stats.dev_stats:
            exposed, _span = exposed_input_us(values.run_metadata.step_stats, self.input_ops)
            self.traced.append((exposed / 1e3, wall * 1e3))

    def live(self) -> str:
        """One short status line for a progress bar: images/s, queue occupancy, input wait."""
        parts = []
        if self.recent:
            parts.append(f"{self.images_per_step / statistics.mean(self.recent):.0f} img/s")
        parts += [w for w in (s.live() for s in self.stages) if w]
        if self.traced:
            w, s = self.traced[-1]
            parts.append(f"input wait {100 * w / s:.0f}%")
        return ", ".join(parts)

    def summary(self) -> dict:
        """The telemetry block of a path's result (see docs/results.md): each stage's own figures."""
        out: dict = {
            "sampled_steps": len(self.traced),
            "sample_every": self.sample_every,
            # Traced and sampled steps run between the timed windows, never inside them.
            "untimed_steps": self.schedule.repeats * (self.schedule.traced + self.schedule.settle),
        }
        out.update(input_wait_figures(self.traced))
        out.update(dict.fromkeys(STAGES))  # every stage named, None where it reported nothing
        out.update(stage_figures(self.path, *self._window))
        return out


class CpuUse(Callback):
    """CPU seconds of each input stage over the timed steps (profiler/cpu.py): producers, receive threads.

    Two snapshots, before the first timed step and after the last one; reading
    /proc and psutil twice costs a few milliseconds, outside the timed window's steps:
    StepTimer hands this the last warm-up step and the run's last step once each has
    ended (its clock already read), never a timed step.
    """

    def __init__(self, warmup: int, total_steps: int, producers=None) -> None:
        self.warmup = warmup
        self.total_steps = total_steps
        self.producers = producers  # a ProducerGroup (its procs' pids), or None
        self._a = self._b = None

    def _meter(self):
        from profiler.cpu import CpuMeter

        pids = [p.pid for p in self.producers.procs] if self.producers is not None else []
        return CpuMeter(pids)

    def _start(self) -> None:
        self.meter = self._meter()
        self._a = self.meter.snapshot()

    def _before_train(self) -> None:
        if self.warmup == 0:  # no warm-up step to follow: before the first step
            self._start()

    def steps_with(self) -> set[int]:
        """None: this adds nothing to a step (StepTimer, harness/tf/measure.py)."""
        return set()

    def steps_after(self) -> set[int]:
        """The steps after which this snapshots: the last warm-up step and the run's last step."""
        return {s for s in (self.warmup - 1, self.total_steps - 1) if s >= 0}

    def after_step(self, step: int, ctx, values) -> None:
        if step == self.warmup - 1:
            self._start()
        if step == self.total_steps - 1 and self._a is not None:
            self._b = self.meter.snapshot()

    def summary(self) -> dict | None:
        if self._a is None or self._b is None:
            return None
        return self.meter.between(self._a, self._b, self.total_steps - self.warmup)
