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
Every probe is kept, so a reader sees the search, not just its answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

THRESHOLD = 0.97


@dataclass
class CapacitySearch:
    towers: int
    probe: Callable[[float], dict]  # rate per device -> a path result (images_per_sec.median, ...)
    baseline: Callable[[float], float]  # rate per device -> baseline images/s at that rate
    threshold: float = THRESHOLD
    max_probes: int = 5
    tolerance: float = 0.1
    probes: list[dict] = field(default_factory=list)

    def _try(self, rate: float) -> tuple[bool, float]:
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
            while len(self.probes) < self.max_probes - 2:
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
        best = max((p for p in self.probes if p["kept_up"]), key=lambda p: p["rate_per_device"], default=None)
        # Never more than a probe delivered: a demand the devices could not step at (a rate beyond what this
        # machine emulates) is not a capacity of the path.
        capacity = min(lo * self.towers, best["images_per_sec"]) if lo is not None and best else None
        return {
            "threshold": self.threshold,
            "images_per_sec": capacity,
            "rate_per_device": lo,
            "achieved_images_per_sec": best["images_per_sec"] if best else None,
            "bracket_per_device": [lo, hi],
            "below_lowest_probe": lo is None,
            "probes": self.probes,
        }
