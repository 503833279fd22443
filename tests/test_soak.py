"""The short soak: 30 s of full-rate zmq-consume streaming, with RSS of trainer and producers held within 5%."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.timeout(180)


def test_thirty_second_soak_keeps_memory_flat(procs):
    p = procs.start("scripts/soak.py", "--duration", "30", "--warmup", "5")
    out, err = p.communicate(timeout=150)
    assert p.returncode == 0, out + err
    rows = re.findall(r"(trainer|producers)\s+RSS\s+([\d.]+) MiB ->\s+([\d.]+) MiB \(([+-][\d.]+)%\) ok", out)
    assert {r[0] for r in rows} == {"trainer", "producers"}, out
    for _, _, _, growth in rows:
        assert float(growth) <= 5.0
