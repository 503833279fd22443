"""Every host-to-device copy of the PyTorch trainer comes from pinned memory, and is checked to.

`torch.cuda.set_sync_debug_mode` does not flag a `non_blocking` copy from
pageable memory (CUDA stages it and the host waits), so the trainer checks the
source itself: every path copies through `feeders.device_copy.to_device`,
which refuses a pageable tensor before any CUDA call. Checked here without a
GPU: the refusal, and that no path copies to the device any other way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from feeders.device_copy import PageableCopy, to_device  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# bandwidth.py measures pageable copies on purpose (the figure pinned memory is compared with).
ALLOWED = {("feeders/device_copy.py", "to_device"), ("harness/torch/bandwidth.py", "copy_gbps")}


def test_a_copy_from_pageable_memory_is_refused_naming_the_tensor():
    labels = torch.arange(8, dtype=torch.int32)  # a fresh host tensor, as labels.long() on the host makes
    with pytest.raises(PageableCopy, match=r"^host->device copy of a \(8,\) int32 tensor from pageable memory"):
        to_device([labels], torch.device("cuda", 0))


def test_a_tensor_already_on_the_target_device_is_not_a_host_copy():
    t = torch.zeros(3)
    assert to_device([t], torch.device("cpu"))[0].data_ptr() == t.data_ptr()  # no copy, nothing refused


def copies_outside_the_check() -> list[str]:
    """`x.to(..., non_blocking=...)` / `x.copy_(..., non_blocking=...)` calls of the PyTorch side outside ALLOWED."""
    found = []
    for path in sorted(
        p for d in ("harness/torch", "consumers", "feeders", "models") for p in (ROOT / d).rglob("*.py")
    ):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or (rel, fn.name) in ALLOWED:
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("to", "copy_", "cuda")
                    and any(k.arg == "non_blocking" for k in node.keywords)
                ):
                    found.append(f"{rel}:{node.lineno} in {fn.name}")
    return found


def test_every_path_copies_to_the_device_through_the_pinned_check():
    assert copies_outside_the_check() == []
