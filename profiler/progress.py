"""Progress of one run: a tqdm bar over warm-up and measured steps, with a live status line.

Bars go to stderr and only when it is a terminal, so a log or a pipe gets
the plain lines the CLI prints, not carriage-return noise. A trainer calls
`begin`, `step` after every step, and `end`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm

STATUS_EVERY_S = 0.5  # the live status is asked for at most this often, not in every step it would slow


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
        self._status_at = -STATUS_EVERY_S

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
        if self.status is not None and not self.bar.disable:  # no status line asked for when none is shown
            now = time.monotonic()
            if now - self._status_at >= STATUS_EVERY_S:
                self._status_at = now
                self.bar.set_postfix_str(self.status(), refresh=False)
        self.bar.update(1)

    def end(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
