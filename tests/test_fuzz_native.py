"""A short run of `make fuzz-asan`: the native fuzzers, built with ASan and UBSan, try inputs on every
target (the shm:// consumer's hand-over and Resolve among them) and find nothing (the full budget is
`make fuzz-asan`, 60 s per target)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(900)
def test_sanitized_fuzzers_run_clean_on_every_target() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz_native.py"), "--seconds", "2", "--seed", "7", "--json"],
        capture_output=True, text=True, timeout=840, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    figures = {f["target"]: f for f in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert set(figures) == {"roi", "wire", "receiver", "shm", "shm_receiver", "curve"}
    assert all(f["inputs"] > 0 for f in figures.values()), figures
    assert figures["roi"]["decoded"] > 0 and figures["receiver"]["accepted"] > 0, figures  # past the headers
    assert figures["shm"]["handovers"] > 0 and figures["shm"]["resolved"] > 0, figures  # regions mapped and read
    assert figures["shm_receiver"]["accepted"] > 0, figures
    assert figures["curve"]["accepted"] > 0, figures  # past the CURVE handshake
