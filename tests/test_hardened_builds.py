"""Every native library is built hardened: full RELRO with immediate binding, a stack protector and
fortified libc calls (core/native_flags.py), as `readelf` shows on the built files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from core.images.jpeg_roi.build import build as build_roi
from models.tf.emulated_op.build import build as build_emulated
from runner.bind_host import library as bind_shim
from zmq_ops.build import build as build_op
from zmq_ops.build import build_receiver

LIBRARIES = {
    "zmq_ops op": lambda: build_op(verbose=False),
    "receiver": lambda: build_receiver(verbose=False),
    "emulated device op": lambda: build_emulated(verbose=False),
    "ROI JPEG decoder": lambda: build_roi(verbose=False),
    "bind shim": lambda: Path(bind_shim()),
}


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "--wide", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_native_library_is_hardened(name: str) -> None:
    lib = str(LIBRARIES[name]())  # built now if its sources changed (as the suite's first use would)
    dynamic = readelf("--dynamic", lib)
    assert "BIND_NOW" in dynamic or "FLAGS_1" in dynamic and " NOW" in dynamic, f"{name}: no BIND_NOW\n{dynamic}"
    assert "GNU_RELRO" in readelf("--program-headers", lib), f"{name}: no RELRO segment"
    symbols = readelf("--dyn-syms", lib)
    guarded = [s for s in ("__stack_chk_fail", "__memcpy_chk", "__snprintf_chk", "__fprintf_chk") if s in symbols]
    assert "__stack_chk_fail" in guarded, f"{name}: no stack protector ({guarded})"
