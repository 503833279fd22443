"""Progress of one run: a tqdm bar over warm-up and measured steps, with a live status line.

Bars go to stderr and only when it is a terminal, so a log or a pipe gets
the plain lines the CLI prints, not carriage-return noise. A trainer calls
`begin`, `step` after every step, and `end`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from tqdm import tqdm


def interactive() -> bool:
    return sys.stderr.isatty()


class RunProgress:
    """Counts steps; the description says the phase, the postfix the telemetry's live status."""

    def __init__(
        self, path: str, warmup: int, total: int, status: Callable[[], str] | None = None, position: int | None = None
    ) -> None:
        self.path = path
        self.warmup = warmup
        self.total = total
        self.status = status
        self.position = position
        self.bar = None
        self.steps = 0

    def begin(self) -> None:
        desc = f"{self.path}: waiting for the first batch" if self.warmup else f"{self.path}: measuring"
        self.bar = tqdm(
            total=self.total,
            desc=desc,
            unit="step",
            file=sys.stderr,
            disable=not interactive(),
            position=self.position,
            leave=False,
            dynamic_ncols=True,
        )

    def step(self) -> None:
        self.steps += 1
        if self.bar is None:
            return
        if self.steps == 1 and self.warmup:
            self.bar.set_description_str(f"{self.path}: warm-up")
        if self.steps == self.warmup:
            self.bar.set_description_str(f"{self.path}: measuring")
        if self.status is not None:
            self.bar.set_postfix_str(self.status(), refresh=False)
        self.bar.update(1)

    def end(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
