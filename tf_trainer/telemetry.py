"""Per-stage telemetry of one run, gathered cheaply every step (the TensorFlow side).

Input wait is measured from TensorFlow's own op timings: on a sample of the
measured steps (every `sample_every`-th), the step runs with
`RunOptions(trace_level=FULL_TRACE)` and the step's `RunMetadata.step_stats`
give each op's start and end. The input ops (each path names its own: queue
dequeue, the zmq pull op, tf.data's IteratorGetNext, StagingArea unstage) are
the ones that block when no batch is ready. A step waits for input only while
such an op runs and no other op does: that *exposed* input time, over the
step's wall time, is the input share of the step (the TensorFlow profiler's
convention). Input ops that run in parallel with compute cost nothing.

This callback only gathers: each stage (the path's queue, the staging areas)
gives the tensors to fetch with every measured step and turns its samples
into its own figures; the path gives the wire's counters and its producers'
figures (profiler/telemetry.py computes the dicts). See docs/profiling.md.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from tensorpack.callbacks import Callback

from profiler.telemetry import exposed_input_us, input_wait_figures, wire_figures
from tf_trainer.tf_env import tf

tf = tf()

# The stage names of the telemetry block, present (maybe None) in every result.
STAGES = ("queue", "staging", "wire", "producers")


class Telemetry(Callback):
    """Samples every stage once per step; traces every `sample_every`-th measured step for input wait.

    `path` is the run's TFInputPath: its `sampled_stages()`, `input_op_types`,
    `counters(session)` and `producer_figures(window)` are all this reads.
    """

    def __init__(
        self, path, warmup: int, images_per_step: int, sample_every: int = 4, total_steps: int | None = None
    ) -> None:
        self.path = path
        self.warmup = warmup
        self.images_per_step = images_per_step
        self.sample_every = max(1, sample_every)
        self.total_steps = total_steps  # known: read the counters at the last step only
        self.step = 0
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

    def measuring(self) -> bool:
        return self.step >= self.warmup

    def _before_run(self, ctx):
        self._t0 = time.perf_counter()
        if self.step == self.warmup:
            self._window[0] = self.path.counters(ctx.session)
        self._tracing = self.measuring() and not self.paused and (self.step - self.warmup) % self.sample_every == 0
        options = None
        if self._tracing:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        return tf.compat.v1.train.SessionRunArgs(fetches=self._fetches, options=options)

    def _after_run(self, ctx, values) -> None:
        wall = time.perf_counter() - self._t0
        self.recent.append(wall)
        res = values.results or {}
        if self.measuring():
            for s in self.stages:
                if s.name in res:
                    s.record(res[s.name])
            if self._tracing and values.run_metadata is not None:
                exposed, _span = exposed_input_us(values.run_metadata.step_stats, self.input_ops)
                self.traced.append((exposed / 1e3, wall * 1e3))
            if self.total_steps is None or self.step == self.total_steps - 1:
                self._window[1] = self.path.counters(ctx.session)
        self.step += 1

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
        out: dict = {"sampled_steps": len(self.traced), "sample_every": self.sample_every}
        out.update(input_wait_figures(self.traced))
        out.update(dict.fromkeys(STAGES))
        for s in self.stages:
            out[s.name] = s.figures()
        first, last = self._window
        out["wire"] = wire_figures(first, last)
        out["producers"] = self.path.producer_figures((first, last) if first and last else None)
        return out
