"""ZMQ I/O threads: a consumer reads several producers at once on a machine with the cores for it.

One I/O thread per ZMQ context read about 1.7 GB/s on a 16-core H200 machine (docs/gpu.md): the native
receiver's input-only ceiling with 8 producers was 11,220 images/s at 224x224, and 37,056 with 4 threads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from consumers.zmq_pull import io_threads
from zmq_ops.receiver import Receiver

ROOT = Path(__file__).resolve().parent.parent
BATCH, SIZE = 4, 16
SPECS = [("uint8", (BATCH, SIZE, SIZE, 3)), ("int32", (BATCH,))]


def zmq_io_threads() -> int:
    """libzmq's I/O threads in this process, by the names it gives them."""
    count = 0
    for t in os.listdir("/proc/self/task"):
        try:
            count += Path(f"/proc/self/task/{t}/comm").read_text().startswith("ZMQbg/IO/")
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return count


def io_threads_become(n: int) -> int:
    """The count once it is `n`: each thread names itself when it starts, just after the context makes it."""
    deadline = time.monotonic() + 30
    while zmq_io_threads() != n and time.monotonic() < deadline:
        time.sleep(0.01)
    return zmq_io_threads()


def test_the_rule_gives_one_io_thread_per_four_cores_from_one_to_four(monkeypatch) -> None:
    monkeypatch.delenv("FEEDBENCH_ZMQ_IO_THREADS", raising=False)
    assert [io_threads(c) for c in (1, 2, 7, 8, 16, 64)] == [1, 1, 1, 2, 4, 4]
    monkeypatch.setenv("FEEDBENCH_ZMQ_IO_THREADS", "6")
    assert io_threads(2) == 6
    monkeypatch.setenv("FEEDBENCH_ZMQ_IO_THREADS", "")  # empty is unset: the rule
    assert io_threads(16) == 4


# Not a whole number from 1 to 64 in ASCII digits: too many (each thread costs file descriptors), a superscript,
# a space, a suffix, another script's digit, a sign, zero, and bytes that are not text.
REFUSED = ["1000000000", "65", "0", "²", " 2", "2 ", "2abc", "٣", "+2", "-1", "0x2", "2\n", "\udcff"]


def native_open_error(ep: str) -> str:
    """The native receiver's error on opening `ep` with this process's environment ("" where it opens)."""
    try:
        with Receiver(ep, SPECS, [[np.zeros(shape, dtype) for dtype, shape in SPECS]], timeout_ms=1000):
            return ""
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("value", REFUSED)
def test_a_value_outside_the_rule_is_one_line_from_python_and_the_native_receiver_alike(value, ipc_dir, monkeypatch):
    """One rule for both parsers: the same line from pyzmq's consumers and the native receiver, which opens
    nothing (no thread, no socket)."""
    from core.errors import ConfigError

    monkeypatch.setenv("FEEDBENCH_ZMQ_IO_THREADS", value)
    with pytest.raises(ConfigError) as python:
        io_threads()
    line = str(python.value)
    assert line.startswith("FEEDBENCH_ZMQ_IO_THREADS=") and "not a whole number from 1 to 64" in line
    assert "\n" not in line
    before = zmq_io_threads()
    assert native_open_error(f"ipc://{ipc_dir}/bad") == line
    assert zmq_io_threads() == before


@pytest.mark.parametrize("value", ["1", "02", "64"])
def test_a_value_inside_the_rule_is_taken_by_both(value, ipc_dir, monkeypatch):
    monkeypatch.setenv("FEEDBENCH_ZMQ_IO_THREADS", value)
    assert io_threads() == int(value)
    assert native_open_error(f"ipc://{ipc_dir}/good") == ""


def test_a_run_with_a_bad_value_stops_before_it_starts_anything(tmp_path) -> None:
    """bench_input.py checks the variable with its flags: one line, exit 2, no consumer aborted, no folder left."""
    env = {**os.environ, "FEEDBENCH_ZMQ_IO_THREADS": "1000000000", "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "bench_input.py", "--fake-location", "zmq-consume", "--input-only", "--steps", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.splitlines() == [
        "error: FEEDBENCH_ZMQ_IO_THREADS='1000000000' is not a whole number from 1 to 64 (ZMQ I/O threads per "
        "consumer; unset, one per 4 cores)"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(120)
def test_the_native_receiver_reads_every_producer_with_the_io_threads_asked_for(procs, ipc_dir, monkeypatch) -> None:
    monkeypatch.setenv("FEEDBENCH_ZMQ_IO_THREADS", "3")
    before = zmq_io_threads()
    ep = f"ipc://{ipc_dir}/r"
    ring = [[np.zeros(shape, dtype) for dtype, shape in SPECS] for _ in range(3)]
    with Receiver(ep, SPECS, ring, timeout_ms=20_000) as r:
        assert io_threads_become(before + 3) == before + 3
        procs.producer(ep, "--batch", str(BATCH), "--image-size", str(SIZE), "--workers", "3", "--count", "60")
        for _ in range(60):
            r.release(r.next())
        rows, messages, _ = r.stats()
        assert messages == 60 and [row[:2] for row in rows] == [(0, 20), (1, 20), (2, 20)]
    assert io_threads_become(before) == before  # stopped with the receiver


def test_a_python_consumer_s_context_has_the_io_threads_of_the_rule(ipc_dir) -> None:
    code = (
        "import zmq\nfrom consumers.zmq_pull import PullConsumer\n"
        f"c = PullConsumer('ipc://{ipc_dir}/p')\nprint(c._ctx.get(zmq.IO_THREADS))\nc.close()\n"
    )
    env = {**os.environ, "FEEDBENCH_ZMQ_IO_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2"]
