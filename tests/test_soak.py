"""The short soak: 30 s of full-rate zmq-consume streaming, with RSS of trainer and producers held within 5%.

The soak (trainer and producers) runs on one core: full rate is whatever that core gives, which is as much
streaming as memory needs to show a leak, and the suite's other tests keep the rest of the machine.
"""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.timeout(180)


def test_thirty_second_soak_keeps_memory_flat(procs):
    core = min(os.sched_getaffinity(0))
    p = procs.start(
        "scripts/soak.py", "--duration", "30", "--warmup", "5", preexec_fn=lambda: os.sched_setaffinity(0, {core})
    )
    out, err = p.communicate(timeout=150)
    assert p.returncode == 0, out + err
    rows = re.findall(r"(trainer|producers)\s+RSS\s+([\d.]+) MiB ->\s+([\d.]+) MiB \(([+-][\d.]+)%\) ok", out)
    assert {r[0] for r in rows} == {"trainer", "producers"}, out
    for _, _, _, growth in rows:
        assert float(growth) <= 5.0
