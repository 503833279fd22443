"""Named ranges in a torch.profiler trace, for every PyTorch stage that feeds a step.

`record_function` costs about 12 µs per use even when no profiler runs
(torch 2.14.1 on the 2-core development machine; docs/profiling.md), so the
paths, the feeders and the trainer open ranges through `stage()`, which
returns a shared no-op context unless a profiler is recording (0.3 µs). The
range names and `--profile` itself: harness/torch/tracing.py.
"""

from __future__ import annotations

import contextlib

import torch.autograd.profiler as _autograd_profiler
from torch.profiler import record_function

_NOTHING = contextlib.nullcontext()


def profiling() -> bool:
    """True while a torch profiler records (ours, or one the user runs around feedbench)."""
    return getattr(_autograd_profiler, "_is_profiler_enabled", True)


def stage(name: str) -> contextlib.AbstractContextManager:
    """A named range `name` in a profiler trace; a no-op costing a flag read when no profiler records."""
    return record_function(name) if profiling() else _NOTHING
