"""Which steps of a run are timed, and where the measuring that would disturb them runs instead.

The same schedule for both trainers (the TensorFlow one samples telemetry in untimed steps; the
PyTorch one samples every timed step with two clock reads or CUDA events, so it has none).

Tracing a step (telemetry's input wait, --profile) slows it, and fetching
queue sizes adds ops to it. So none of that runs inside a timed window: a
run is the warm-up, then `repeats` times a window of `steps` timed steps
followed by `traced` untimed telemetry steps, then `profiled` untimed
profiler steps. The timed steps run the training op and fetch the loss,
nothing else, whether telemetry is on or off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SETTLE_STEPS = 2
PROFILED_STEPS = 3  # TensorFlow --profile: steps under its profiler, then one step traced into a timeline


@dataclass(frozen=True)
class Schedule:
    warmup: int
    steps: int
    repeats: int
    traced: int = 0  # telemetry steps after each window
    profiled: int = 0  # --profile steps after the last window
    settle: int = 0  # plain untimed steps after each window's telemetry steps, before the next window

    @property
    def period(self) -> int:
        """Steps from one window's start to the next's."""
        return self.steps + self.traced + self.settle

    @classmethod
    def for_run(cls, warmup: int, steps: int, repeats: int, telemetry_every: int | None, profile: bool) -> Schedule:
        """As many traced steps per window as tracing every `telemetry_every`-th timed step would give."""
        traced = math.ceil(steps / max(1, telemetry_every)) if telemetry_every else 0
        # A traced step leaves the next few slower (the tracer's buffers): let that pass before timing again.
        settle = SETTLE_STEPS if traced else 0
        return cls(warmup, steps, repeats, traced, PROFILED_STEPS + 1 if profile else 0, settle)

    @classmethod
    def of(cls, cfg) -> Schedule:
        """The schedule of a run configured by `cfg` (a BenchConfig)."""
        every = cfg.telemetry_every if cfg.telemetry else None
        return cls.for_run(cfg.warmup_steps, cfg.steps, cfg.repeats, every, bool(cfg.profile_dir))

    @property
    def total(self) -> int:
        return self.warmup + self.repeats * self.period + self.profiled

    @property
    def untimed_after_warmup(self) -> int:
        """Steps run after the warm-up and left out of every window."""
        return self.repeats * (self.traced + self.settle) + self.profiled

    @property
    def profile_start(self) -> int:
        return self.warmup + self.repeats * self.period

    def window(self, r: int) -> range:
        """The steps of timed window `r`."""
        a = self.warmup + r * self.period
        return range(a, a + self.steps)

    def timed(self, step: int) -> bool:
        k = step - self.warmup
        return 0 <= k < self.repeats * self.period and k % self.period < self.steps

    def telemetry(self, step: int) -> bool:
        """A step after a window, for telemetry to trace and sample."""
        k = step - self.warmup
        return 0 <= k < self.repeats * self.period and self.steps <= k % self.period < self.steps + self.traced

    def to_dict(self) -> dict:
        return {
            "warmup": self.warmup,
            "timed_windows": self.repeats,
            "timed_steps_per_window": self.steps,
            "telemetry_steps_per_window": self.traced,
            "settle_steps_per_window": self.settle,
            "profile_steps": self.profiled,
            "untimed_steps": self.untimed_after_warmup,
        }
