"""`gpu-decode`: producers read the JPEG folder and send each batch's files undecoded; each rank decodes,
crops, flips and resizes them on its own device (nvJPEG through torchvision), so the host's work per image
is reading its bytes.

PyTorch only: TensorFlow's `tf.io.decode_jpeg` has no GPU kernel (it decodes on the CPU wherever it is
placed), and DALI's `mixed` decoder, the way to decode JPEGs on the GPU under TensorFlow, is the `dali` path.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from consumers.fields import PRODUCER_FED
from core.errors import ConfigError
from core.registry import Declaration, needs_data
from core.result_fields import ResultField, rank_rows


def validate(cfg: Any) -> None:
    """A JPEG folder to read."""
    needs_data(cfg, "gpu-decode")


def installed(cfg: Any) -> None:
    """torchvision, whose decode_jpeg decodes the batch (on the GPU with nvJPEG); checked without importing torch."""
    if importlib.util.find_spec("torchvision") is None:
        raise ConfigError("--fake-location gpu-decode: torchvision is not installed (pip install torchvision)")


# Per rank: how often its steps got each file of its producers' shards (FilesSeen in torch.py).
FILES = ResultField(
    "files",
    {
        "type": "array",
        "description": "torch gpu-decode: per rank, the files of its producers' shards (mine), how many reached the step (delivered, distinct), and whether each came once per pass of the worker that sends it",
        "items": {
            "type": "object",
            "required": ["rank", "mine", "skipped", "delivered", "distinct", "once_per_pass"],
            "properties": {
                "rank": {"type": "integer", "minimum": 0},
                "mine": {"type": "integer", "minimum": 0},
                "skipped": {"type": "integer", "minimum": 0, "description": "files the producers skipped: not JPEGs"},
                "delivered": {"type": "integer", "minimum": 0},
                "distinct": {"type": "integer", "minimum": 0},
                "once_per_pass": {"type": "boolean"},
                "decoded_on_host": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "files the device's decoder refused (nvJPEG: CMYK, say), decoded on the host instead",
                },
            },
            "additionalProperties": False,
        },
    },
    rank_rows,
)

PATH = Declaration(
    name="gpu-decode",
    summary="producers send the JPEG files' bytes; each rank decodes, crops and resizes them on its device",
    order=55,
    in_default_run=False,
    needs_producers=True,
    advice="the device's decode limits: a smaller batch per decode call, or decode part of the files in producers",
    input_advice="add producers (--producers): they only read files",
    validate=validate,
    checks={"torch": installed},
    frameworks=("torch",),
    fields=(*PRODUCER_FED, FILES),
)
