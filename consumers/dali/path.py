"""`dali`: a DALI pipeline decodes a JPEG folder inside the trainer's process (no producers)."""

from __future__ import annotations

from typing import Any

from consumers.fields import BATCHES_PULLED, DECODED_ON
from core.errors import ConfigError
from core.registry import Declaration, needs_data
from core.result_fields import ResultField, per_rank

TF_PLUGIN_INSTALL = (
    "pip install -e '.[dali]' (nvidia-dali-cuda120 and nvidia-dali-tf-plugin-cuda120, built with --no-build-isolation)"
)


def validate(cfg: Any) -> None:
    """A JPEG folder to decode; each half's own check finds its DALI plugin."""
    needs_data(cfg, "dali")


def tf_plugin(cfg: Any) -> None:
    """DALI's TensorFlow plugin is installed (ConfigError naming how to install it)."""
    try:
        import nvidia.dali.plugin.tf  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"--fake-location dali: DALI's TensorFlow plugin is not installed; {TF_PLUGIN_INSTALL}"
        ) from None


def torch_plugin(cfg: Any) -> None:
    """DALI's PyTorch plugin imports (ConfigError with the import's own words)."""
    try:
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"--fake-location dali: DALI's PyTorch plugin is not importable ({e})") from None


# TensorFlow's half: where DALI decoded (one process; a PyTorch run's ranks say it in decoded_on).
DALI_DEVICE = ResultField(
    "dali_device", {"type": "string", "description": "tf dali: where DALI decoded"}, per_rank("on")
)

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
    checks={"tf": tf_plugin, "torch": torch_plugin},
    fields=(BATCHES_PULLED, DECODED_ON, DALI_DEVICE),
)
