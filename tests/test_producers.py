"""Producer processes against a real Python consumer: counts, sequence numbers, shutdown, bad endpoints."""

from __future__ import annotations

import json
import signal
import socket
import time

import numpy as np
import psutil
import pytest
from conftest import descendants

from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from wire.endpoints import EPHEMERAL_RANGE, free_tcp_port

pytestmark = pytest.mark.timeout(120)


def test_a_free_tcp_port_is_below_the_ephemeral_range_and_can_be_bound():
    """Outgoing connections take ports from the ephemeral range: one below it is not taken from under a test."""
    with open(EPHEMERAL_RANGE) as f:
        low = int(f.read().split()[0])
    ports = {free_tcp_port() for _ in range(20)}
    assert all(10_000 <= port < low for port in ports), (low, ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@pytest.mark.parametrize("fmt", ["native", "zmq_ops"])
def test_producer_delivers_exactly_count_batches(procs, ipc_dir, fmt):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=30) as c:
        p = procs.producer(
            endpoint, "--wire-format", fmt, "--count", "12", "--batch", "4", "--image-size", "16", "--workers", "2"
        )
        batches = [c.recv() for _ in range(12)]
        with pytest.raises(ReceiveTimeout, match="feed"):
            c.recv_timeout = 0.5
            c.recv()  # nothing more than asked for
    assert p.wait(30) == 0, p.stderr.read()  # it leaves once its consumer has hung up
    images = [b.arrays[0] for b in batches]
    labels = [b.arrays[1] for b in batches]
    assert all(i.shape == (4, 16, 16, 3) and i.dtype == np.uint8 for i in images)
    assert all(lab.shape == (4,) and lab.dtype == np.int32 for lab in labels)
    assert all(i.any() for i in images), "images must not be all zeros"
    assert len({lab.tobytes() for lab in labels}) > 1, "labels must vary from batch to batch"
    assert sum(b.nbytes for b in batches) == c.bytes
    if fmt == "native":
        # Two workers, six batches each, numbered 0..5 in order: nothing lost or repeated.
        seqs: dict[int, list[int]] = {}
        for b in batches:
            seqs.setdefault(b.header.producer_id, []).append(b.header.seq)
        assert seqs == {0: list(range(6)), 1: list(range(6))}
        rows = c.tracker.table()
        totals = {k: sum(r[k] for r in rows) for k in ("received", "lost", "duplicated", "restarts")}
        assert totals == {"received": 12, "lost": 0, "duplicated": 0, "restarts": 0}


def test_producer_writes_its_figures_to_its_stats_file(procs, ipc_dir, tmp_path):
    """For consumers that see no header (the op, the zmq_ops format): the producer's own figures, as JSON."""
    endpoint = f"ipc://{ipc_dir}/feed"
    stats = tmp_path / "stats.json"
    with PullConsumer(endpoint, recv_timeout=30) as c:
        p = procs.producer(endpoint, "--wire-format", "zmq_ops", "--batch", "4", "--image-size", "8", "--rate", "200",
                           "--stats-file", str(stats))  # fmt: skip
        deadline = time.monotonic() + 30
        while not stats.exists() and time.monotonic() < deadline:
            c.recv()
        for _ in range(20):
            c.recv()
    figures = json.loads(stats.read_text())
    assert figures["images_per_sec"] > 0 and figures["bytes_per_sec"] > 0
    assert figures["batches"] >= 1 and figures["send_latency_ms"] >= 0
    assert [f.name for f in tmp_path.iterdir()] == ["stats.json"], "written atomically: no temporary file left"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0


def test_native_header_carries_producer_telemetry(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=30) as c:
        procs.producer(endpoint, "--count", "5", "--batch", "2", "--image-size", "8")
        last = [c.recv() for _ in range(5)][-1]
    assert last.header.extras["sent"] == 4
    assert last.header.extras["images_per_sec"] > 0
    assert last.header.extras["send_latency_ms"] >= 0
    assert time.time_ns() - last.header.send_time_ns < 60e9


def test_rate_cap_limits_a_producer(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=30) as c:
        procs.producer(endpoint, "--count", "6", "--batch", "10", "--image-size", "8", "--rate", "50")
        c.recv()
        t0 = time.perf_counter()
        for _ in range(5):
            c.recv()
        # 50 images/s in batches of 10: five more batches cannot arrive in well under a second.
        assert time.perf_counter() - t0 > 0.8


def test_sigterm_stops_producer_and_all_workers(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=30) as c:
        p = procs.producer(endpoint, "--batch", "2", "--image-size", "8", "--workers", "3")
        c.recv()
        workers = descendants(p.pid)
        assert len([w for w in workers if "python" in w.name()]) >= 3
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"workers left running: {alive}"


def test_sigint_stops_producer_and_all_workers(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=30) as c:
        p = procs.producer(endpoint, "--batch", "2", "--image-size", "8", "--workers", "2")
        c.recv()
        workers = descendants(p.pid)
        p.send_signal(signal.SIGINT)
        assert p.wait(20) == 0
    assert not psutil.wait_procs(workers, timeout=10)[1]


def test_producer_stops_when_its_consumer_disappears(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    c = PullConsumer(endpoint, recv_timeout=30)
    p = procs.producer(endpoint, "--batch", "2", "--image-size", "8", "--workers", "2", "--give-up-after", "2")
    seen = set()
    while seen != {0, 1}:  # both workers have been taken a batch: their give-up timers are armed
        seen.add(c.recv().header.producer_id)
    workers = descendants(p.pid)
    c.close()
    assert p.wait(30) == 3
    assert "no consumer took a batch" in p.stderr.read()
    assert not psutil.wait_procs(workers, timeout=10)[1]


def test_bound_producer_serves_a_connecting_consumer(procs):
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    p = procs.producer(endpoint, "--bind", "--count", "6", "--batch", "2", "--image-size", "8", "--producer-id", "5")
    with PullConsumer(endpoint, bind=False, recv_timeout=30) as c:
        got = [c.recv().header for _ in range(6)]
    assert [(h.producer_id, h.seq) for h in got] == [(5, i) for i in range(6)]
    assert p.wait(30) == 0


def test_bind_with_several_workers_is_refused(procs):
    line = _one_error_line(procs.producer("tcp://127.0.0.1:5555", "--bind", "--workers", "2"))
    assert "tcp://127.0.0.1:5555" in line and "--workers" in line


def _one_error_line(p) -> str:
    assert p.wait(30) == 2
    err = p.stderr.read().strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_scheme_is_one_clear_error(procs):
    line = _one_error_line(procs.producer("http://127.0.0.1:5555"))
    assert "http://127.0.0.1:5555" in line and "scheme" in line


def test_port_in_use_is_one_clear_error(procs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        line = _one_error_line(procs.producer(endpoint, "--bind"))
    assert endpoint in line and "in use" in line


def test_unwritable_ipc_path_is_one_clear_error(procs):
    line = _one_error_line(procs.producer("ipc:///nonexistent-dir/feed", "--bind"))
    assert "ipc:///nonexistent-dir/feed" in line and "does not exist" in line


def test_binding_beyond_loopback_needs_a_flag(procs):
    line = _one_error_line(procs.producer("tcp://0.0.0.0:5555", "--bind"))
    assert "--allow-remote" in line


def test_bench_wire_prints_its_table(procs):
    p = procs.start(
        "-m",
        "benchmarks",
        "bench-wire",
        "--batch",
        "4",
        "--image-size",
        "32",
        "--batches",
        "5",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--transports",
        "ipc",
        "--formats",
        "native",
    )
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "memcpy" in out and "GB/s" in out and "ipc" in out
