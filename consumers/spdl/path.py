"""`spdl`: SPDL's pipeline decodes a JPEG folder inside each rank (PyTorch only; a reference loader)."""

from __future__ import annotations

from typing import Any

from consumers.fields import BATCHES_PULLED
from core.errors import ConfigError
from core.registry import Declaration, needs_data


def validate(cfg: Any) -> None:
    """A JPEG folder to decode."""
    needs_data(cfg, "spdl")


def installed(cfg: Any) -> None:
    """SPDL imports (ConfigError saying how to install it)."""
    try:
        import spdl.pipeline  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"--fake-location spdl: SPDL is not installed ({e}); pip install spdl") from None


PATH = Declaration(
    name="spdl",
    summary="SPDL's pipeline decodes the JPEG folder in the trainer (reference loader)",
    order=60,
    in_default_run=False,
    advice="raise the decode concurrency (--dali-threads), or decode in producers on other cores",
    validate=validate,
    checks={"torch": installed},
    frameworks=("torch",),
    fields=(BATCHES_PULLED,),
)
