"""The host a result was measured on: the fields every trainer's `device` block shares."""

from __future__ import annotations

import os
import platform
import socket


def host_fields() -> dict:
    """CPU, cores, Python and host name; a trainer adds its GPUs and framework version."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
    }


def cpu_threads(local_world: int) -> int:
    """Intra-op threads per rank: the machine's cores shared by the ranks on it (torch-free, so the
    launching process need not import torch to set OMP_NUM_THREADS)."""
    return max(1, (os.cpu_count() or 1) // max(1, local_world))
