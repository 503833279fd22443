"""One set of sequence-counting vectors (wire/seq_vectors.json) for the Python tracker and the native core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from consumers.accounting import SeqTracker
from zmq_ops.receiver import seq_replay

CASES = json.loads((Path(__file__).resolve().parent.parent / "wire" / "seq_vectors.json").read_text())["cases"]


def python_rows(events: list[list[int]]) -> list[list[int]]:
    t = SeqTracker()
    for pid, seq in events:
        t.add(pid, seq)
    return [[r["producer"], r["received"], r["lost"], r["duplicated"], r["restarts"]] for r in t.table()]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_python_tracker(case: dict) -> None:
    assert python_rows(case["events"]) == case["rows"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_native_core(case: dict) -> None:
    assert [list(r) for r in seq_replay([tuple(e) for e in case["events"]])] == case["rows"]
