"""`gpu`: a synthetic batch already on each device, the baseline every other path is measured against."""

from __future__ import annotations

from core.registry import BASELINE, Declaration

PATH = Declaration(
    name=BASELINE,
    summary={
        "tf": "synthetic batch already on the device: the baseline",
        "torch": "a constant random batch made once on each device (the baseline)",
    },
    order=0,
    advice="this is the ceiling the other paths are measured against",
)
