"""Median-of-repeats statistics, the way every figure in feedbench is reported."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Summary:
    """Median with min and max of a set of repeats (and the repeats themselves)."""

    median: float
    min: float
    max: float
    repeats: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("no repeats to summarise")
        return cls(statistics.median(values), min(values), max(values), tuple(values))

    def scaled(self, factor: float) -> Summary:
        return Summary(
            self.median * factor, self.min * factor, self.max * factor, tuple(v * factor for v in self.repeats)
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["repeats"] = list(self.repeats)
        return d

    def fmt(self, spec: str = ".2f") -> str:
        return f"{self.median:{spec}} ({self.min:{spec}}–{self.max:{spec}})"


def rate_figure(x: float) -> str:
    """A rate as every table prints it (the results table, the verdict that quotes it, a comparison)."""
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


# A producer-limited window this many times the producers' own count can only have drained batches queued before
# it: on the H200 (2026-11-28) 25-step windows read 282,818 images/s against the 14 producers' 37,518.
BACKLOG_FACTOR = 2.0


def drained(own: float | None, ips: float) -> bool:
    """Whether a trainer's windows at `ips` images/s read over BACKLOG_FACTOR times the producers' own count: not a
    rate of the path but of batches queued before the windows (the table and the verdict both say so)."""
    return bool(own) and ips > BACKLOG_FACTOR * own
