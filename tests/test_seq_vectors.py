"""One set of sequence-counting vectors (wire/seq_vectors.json) for the Python tracker and the native core."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from consumers.accounting import SeqTracker
from zmq_ops.receiver import library

CASES = json.loads((Path(__file__).resolve().parent.parent / "wire" / "seq_vectors.json").read_text())["cases"]


def seq_replay(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int, int, int, int]]:
    """The native core's accounting over (producer_id, seq) pairs (fb_seq_replay): rows as in Receiver.producers()."""
    lib = library()
    lib.fb_seq_replay.restype = ctypes.c_int
    lib.fb_seq_replay.argtypes = [
        ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
    ]  # fmt: skip
    n = len(pairs)
    ids = (ctypes.c_uint32 * max(1, n))(*[p for p, _ in pairs])
    seqs = (ctypes.c_uint64 * max(1, n))(*[s for _, s in pairs])
    cap = max(1, len({p for p, _ in pairs}))
    rows = (ctypes.c_int64 * (5 * cap))()
    got = lib.fb_seq_replay(ids, seqs, n, rows, cap)
    return [tuple(rows[5 * r : 5 * r + 5]) for r in range(got)]


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


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_byte_string_batches_are_counted_alike(case: dict) -> None:
    """Batches of JPEG files' bytes (wire/strings.py) carry the same header: the same rows from what was decoded."""
    from wire import decode_message, native, strings

    t = SeqTracker()
    for pid, seq in case["events"]:
        frames = native.encode([strings.of([b"\xff\xd8", bytes(seq % 7)]), np.array([pid, seq], np.int64)], pid, seq)
        h = decode_message([bytes(memoryview(f)) for f in frames]).header
        t.add(h.producer_id, h.seq)
    assert [[r["producer"], r["received"], r["lost"], r["duplicated"], r["restarts"]] for r in t.table()] == case[
        "rows"
    ]
