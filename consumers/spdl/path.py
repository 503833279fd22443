"""`spdl`: SPDL's pipeline decodes a JPEG folder inside each rank (PyTorch only; a reference loader)."""

from __future__ import annotations

from typing import Any

from core.registry import Declaration, needs_data


def validate(cfg: Any) -> None:
    """A JPEG folder to decode; the PyTorch half checks that SPDL is installed."""
    needs_data(cfg, "spdl")


PATH = Declaration(
    name="spdl",
    summary="SPDL's pipeline decodes the JPEG folder in the trainer (reference loader)",
    order=60,
    in_default_run=False,
    advice="raise the decode concurrency (--dali-threads), or decode in producers on other cores",
    validate=validate,
    frameworks=("torch",),
)
