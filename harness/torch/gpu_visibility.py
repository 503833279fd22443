"""Why torch sees no GPU on a machine whose driver has some: one line with the driver and the fix.

Its own module because the plugin, `make gpu-check` and the bandwidth check all ask it first, and the
bandwidth check is itself used by the plugin.
"""

from __future__ import annotations

from typing import Any

from core.gpus import unseen_gpus

# How to get a torch that sees the GPUs: PyPI's Linux wheels are CUDA builds (scripts/setup_env.sh).
TORCH_FIX = "install the CUDA build (pip install torch==2.14.1 from PyPI, or run `make install` again)"

# A driver older than torch's CUDA needs: setup picks the torch build for the driver (scripts/setup_env.sh).
TORCH_DRIVER_FIX = "run `make install` again: it installs the torch build for this driver where PyTorch has one"


def unseen_gpu_problem(torch: Any) -> str | None:
    """Why torch sees no GPU on a machine whose driver reports some, with the fix in one line; None if none."""
    return unseen_gpus("torch", torch.cuda.device_count(), torch.version.cuda, TORCH_FIX, TORCH_DRIVER_FIX)
