"""`dali`: a DALI pipeline decodes a JPEG folder inside the trainer's process (no producers)."""

from __future__ import annotations

from typing import Any

from core.registry import Declaration, needs_data


def validate(cfg: Any) -> None:
    """A JPEG folder to decode; each half checks its own DALI plugin."""
    needs_data(cfg, "dali")


PATH = Declaration(
    name="dali",
    summary={
        "tf": "a DALI pipeline in the trainer's process (DALI's TensorFlow plugin); needs --data",
        "torch": "DALI's PyTorch iterator decodes the JPEG folder in the trainer (CPU mode without a GPU)",
    },
    order=50,
    in_default_run=False,
    advice={
        "tf": "DALI's pipeline limits: raise --dali-threads, or decode on the GPU",
        "torch": "more DALI threads (--dali-threads), or decode on the GPU",
    },
    validate=validate,
)
