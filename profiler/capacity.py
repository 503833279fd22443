"""Capacity: the highest demand an input path sustains at >= 97% of the emulated baseline.

Framework-neutral: the trainer hands in `probe(rate)`, which runs the path
against emulated devices at `rate` images/s each for a few dozen steps and
returns what it achieved, and `baseline(rate)`, what the on-device baseline
achieves at that rate. Demand is devices x rate. The search:

1. probe the start rate (the preset's); if the path keeps up, double until it does not;
2. if it does not keep up, it was input-bound and delivered what it can: probe just
   below that delivered rate, stepping down until it keeps up;
3. bisect (geometrically) between the highest rate kept up with and the lowest not,
   until they are within `tolerance` or the probes run out.
The capacity is the demand of the highest probe kept up with, but never more
than that probe delivered.

4. On a shared machine one probe per bracket end cannot rank paths, so the two
   decisive probes (the highest rate kept up with, the lowest not) are tried
   `confirm` more times each. The capacity's `interval` runs from the highest
   demand every try kept up with (or, when a try there fell short, the least
   that try delivered) to the lowest demand a try fell short at (open, `None`,
   when no probe fell short). Two paths whose intervals overlap cannot be told
   apart by this run (`overlap`).
5. The answer is read from every probe, not from the order they ran in: the
   capacity is the highest demand any probe kept up with (never below a
   demand a probe sustained, never above what that probe delivered), the
   bracket's upper end the lowest demand above it that a probe fell short
   at. A try that fell short at the capacity's rate lowers the interval's
   low end instead.
Every probe is kept (repeats marked `"repeat": true`), so a reader sees the
search, not just its answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from core.config import BenchConfig

THRESHOLD = 0.97
# Extra tries at each decisive probe: --capacity-tries' default (make bench ranks the paths by their intervals).
CONFIRM = BenchConfig.capacity_tries
# Steps up past an upper end that a repeated try kept up with. Two left a noisy path's interval open up to
# the first probe's demand in one search in ten (9x its capacity, simulated); three closed it within 3.1x.
MORE_STEPS = 3


@dataclass
class CapacitySearch:
    towers: int
    probe: Callable[[float], dict]  # rate per device -> a path result (images_per_sec.median, ...)
    baseline: Callable[[float], float]  # rate per device -> baseline images/s at that rate
    threshold: float = THRESHOLD
    max_probes: int = BenchConfig.capacity_probes
    tolerance: float = 0.1
    confirm: int = CONFIRM
    probes: list[dict] = field(default_factory=list)

    def _try(self, rate: float, repeat: bool = False) -> tuple[bool, float]:
        result = self.probe(rate)
        got = result["images_per_sec"]["median"]
        base = self.baseline(rate)
        ratio = got / base if base > 0 else 0.0
        kept_up = ratio >= self.threshold
        self.probes.append(
            {
                "rate_per_device": rate,
                "demand_images_per_sec": rate * self.towers,
                "images_per_sec": got,
                "baseline_images_per_sec": base,
                "ratio": ratio,
                "kept_up": kept_up,
                "input_wait_share": (result.get("telemetry") or {}).get("input_wait_share"),
                "repeat": repeat,
            }
        )
        return kept_up, got

    def run(self, start_rate: float, min_rate: float = 1.0) -> dict:
        lo: float | None = None  # highest rate per device kept up with
        hi: float | None = None  # lowest rate per device not kept up with
        rate = start_rate
        kept, got = self._try(rate)
        if kept:
            lo = rate
            # Keep two probes for the bisection, but always try one doubling: a path that kept up with
            # the first demand is otherwise never asked for more (`>= demand` is no capacity).
            while len(self.probes) < max(2, self.max_probes - 2):
                rate *= 2
                kept, got = self._try(rate)
                if not kept:
                    hi = rate
                    break
                lo = rate
        else:
            hi = rate
            while len(self.probes) < self.max_probes and lo is None:
                # Input-bound: it delivered `got`; a demand a little under that should be kept up with.
                rate = max(min_rate, min(0.95 * got / self.towers, 0.7 * hi))
                kept, got = self._try(rate)
                if kept:
                    lo = rate
                else:
                    hi = rate
                    if rate <= min_rate:
                        break
        while lo is not None and hi is not None and hi / lo > 1 + self.tolerance and len(self.probes) < self.max_probes:
            rate = math.sqrt(lo * hi)
            kept, _ = self._try(rate)
            if kept:
                lo = rate
            else:
                hi = rate
        for rate in (lo, hi):
            for _ in range(self.confirm if rate is not None else 0):
                self._try(rate, repeat=True)
        # A try at the upper end kept up after all: the capacity may lie above it. Step up until every try
        # at a rate falls short (at most MORE_STEPS steps; past that the interval stays open above).
        steps = 0
        while self.confirm and lo is not None and hi is not None and self._any_kept(hi):
            if steps == MORE_STEPS:  # no try above fell short: the interval stays open above
                break
            hi *= max(hi / lo, 1 + self.tolerance)
            steps += 1
            for _ in range(1 + self.confirm):
                kept, _ = self._try(hi, repeat=True)
                if kept:
                    break
        return self._answer(lo)

    def _answer(self, sure: float | None) -> dict:
        """The capacity, its interval and bracket, read from every probe; `sure` is the search's own lower end,
        tried `confirm` more times: the interval's low end is read there."""
        lo, hi = self._bracket()
        # Never more than a probe delivered: a demand the devices could not step at (a rate beyond what this
        # machine emulates) is not a capacity of the path. Never less than a demand a probe kept up with.
        best = max(
            (p for p in self.probes if p["kept_up"]),
            key=lambda p: min(p["demand_images_per_sec"], p["images_per_sec"]),
            default=None,
        )
        capacity = min(best["demand_images_per_sec"], best["images_per_sec"]) if best else None
        interval = self._interval(sure, hi)
        at_lo = [p for p in self.probes if lo is not None and p["rate_per_device"] == lo]
        at_hi = [p for p in self.probes if hi is not None and p["rate_per_device"] == hi]
        return {
            "threshold": self.threshold,
            "images_per_sec": capacity,
            "interval": list(interval),
            "tries": {
                "kept_up_at_bracket_low": [sum(p["kept_up"] for p in at_lo), len(at_lo)],
                "kept_up_at_bracket_high": [sum(p["kept_up"] for p in at_hi), len(at_hi)],
            },
            "rate_per_device": best["rate_per_device"] if best else None,
            "achieved_images_per_sec": best["images_per_sec"] if best else None,
            "bracket_per_device": [lo, hi],
            "below_lowest_probe": lo is None,
            "probes": self.probes,
        }

    def _bracket(self) -> tuple[float | None, float | None]:
        """(the highest rate a probe kept up with, the lowest rate above it a probe fell short at).

        Read from every probe, not from the search's path to them: a capacity is never below a demand one of
        its probes kept up with (a try that fell short at that rate widens the interval instead).
        """
        lo = max((p["rate_per_device"] for p in self.probes if p["kept_up"]), default=None)
        hi = min(
            (
                p["rate_per_device"]
                for p in self.probes
                if not p["kept_up"] and (lo is None or p["rate_per_device"] > lo)
            ),
            default=None,
        )
        return lo, hi

    def _any_kept(self, rate: float) -> bool:
        return any(p["kept_up"] for p in self.probes if p["rate_per_device"] == rate)

    def _interval(self, sure: float | None, hi: float | None) -> tuple[float | None, float | None]:
        """[highest demand every try kept up with (or the least a short try there delivered), lowest demand
        a try fell short at above every kept-up one]; see the module's docstring."""
        upper = hi * self.towers if hi is not None else None
        if sure is None:
            return 0.0, upper
        at_lo = [p for p in self.probes if p["rate_per_device"] == sure]
        kept = [p["images_per_sec"] for p in at_lo if p["kept_up"]]
        short = [p["images_per_sec"] for p in at_lo if not p["kept_up"]]
        lower = min(short) if short else min([sure * self.towers, *kept])
        return lower, upper


def overlap(a: list | None, b: list | None) -> bool:
    """Whether two capacity intervals [low, high] (high None: open above) overlap: the paths cannot be told
    apart."""
    if not a or not b or a[0] is None or b[0] is None:
        return False
    a_hi = math.inf if a[1] is None else a[1]
    b_hi = math.inf if b[1] is None else b[1]
    return a[0] <= b_hi and b[0] <= a_hi
