"""10,000 random and mutated messages into the zmq_ops op, over a real socket.

scripts/fuzz_zmq_op.py runs the op in a worker process, so a crash shows up
as a count (with the message that caused it) instead of killing pytest. Each
message must decode exactly as the Python decoder in wire/ decodes it, or fail
with InvalidArgument naming the same field; afterwards a good message must
still arrive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zmq_ops.tf_op", reason="zmq_ops op not built (run `make op`)")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_ten_thousand_fuzzed_messages_never_crash_the_op() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz_zmq_op.py"), "--count", "10000", "--seed", "20240601", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    details = json.dumps(report["examples"], indent=1)
    assert report["sent"] == 10000
    assert report["crashes"] == 0, details
    assert report["other_errors"] == 0, details  # every rejection is InvalidArgument
    assert report["mismatches"] == 0, details  # same verdict and field as the Python decoder
    assert report["final_message_ok"]
    assert report["accepted"] > 0 and report["rejected"] > 0
    # the fuzz reaches every kind of check the decoders make
    fields = set(report["error_fields"])
    for name in ("n_tensors", "header", "magic", "version", "frames", "extras_len", "message"):
        assert name in fields, report["error_fields"]
    assert any(f.startswith("tensor[") and f.endswith(".nbytes") for f in report["error_fields"])
    assert any(f.endswith(".lengths") for f in report["error_fields"])  # byte strings' length tables
    assert proc.returncode == 0
