"""A TensorFlow cluster task listens only where its host:port says, refuses a wide address without --allow-remote,
and says in one line why it stops: a port that is taken, a task that dies.

Real processes: bench_input.py as a user starts it; what listens is read from
the kernel's tables (as `ss -ltn` shows them), and tasks are stopped with real signals.
"""

from __future__ import annotations

import ipaddress
import re
import signal
import socket
import subprocess
import sys

import psutil
import pytest
from listening import only_loopback, wait_listening

from tests.conftest import ROOT, taken_port
from wire.endpoints import free_tcp_port

pytestmark = pytest.mark.timeout(300)
TINY = ["--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "16", "--fake-location", "gpu"]


def bench(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "bench_input.py"), *args]


def one_error(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def task_args(job: str, ps: str, worker: str, *extra: str) -> list[str]:
    return bench(
        "--variable-update", "distributed_replicated", "--job-name", job, "--task-index", "0",
        "--ps-hosts", ps, "--worker-hosts", worker, *TINY, *extra,
    )  # fmt: skip


def test_local_cluster_tasks_listen_on_loopback_only_and_a_killed_task_is_one_plain_line():
    p = subprocess.Popen(
        bench("--local-cluster", "1,1", *TINY, "--warmup-steps", "1", "--steps", "100000", "--repeats", "1"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = p.stdout.readline()
        ports = [int(x) for x in re.findall(r"127\.0\.0\.1:(\d+)", first)]
        assert len(ports) == 2, first
        for port in ports:
            found = wait_listening(p, port)
            assert found == ["127.0.0.1"], f"port {port} listens on {found}"
        tasks = [q for q in psutil.Process(p.pid).children() if "--job-name" in q.cmdline()]
        assert len(tasks) == 2
        for q in tasks:  # nothing else a task opens listens beyond loopback either
            wide = [
                c.laddr for c in q.net_connections("inet") if c.status == "LISTEN" and not only_loopback([c.laddr.ip])
            ]
            assert not wide, f"{q.cmdline()[-8:]} listens on {wide}"
        everyone = [*tasks, *(c for q in tasks for c in q.children(recursive=True))]
        ps = next(q for q in tasks if q.cmdline()[q.cmdline().index("--job-name") + 1] == "ps")
        ps.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2, err[-3000:]
    # The task's own words only: no TensorFlow log text after the reason.
    assert one_error(err) == "error: ps 0 exited with signal SIGKILL"
    _, alive = psutil.wait_procs(everyone, timeout=15)
    assert not [q for q in alive if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]


def serve_then_stop(args: list[str], port: int, expected: list[str], first_line: str | None = None) -> None:
    """Start a parameter-server task, check who listens on `port` (and its first line), stop it with SIGTERM."""
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_listening(p, port) == expected
        if first_line is not None:
            assert first_line in p.stdout.readline()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err[-2000:]


def test_a_task_started_by_hand_listens_on_its_loopback_host_only():
    ps, worker = free_tcp_port(), free_tcp_port()
    args = task_args("ps", f"127.0.0.1:{ps}", f"127.0.0.1:{worker}")
    serve_then_stop(args, ps, ["127.0.0.1"], f"ps 0: serving on 127.0.0.1:{ps}")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.77"])
def test_a_cluster_address_beyond_loopback_needs_allow_remote(host):
    r = subprocess.run(
        task_args("ps", f"{host}:{free_tcp_port()}", f"127.0.0.1:{free_tcp_port()}"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    line = one_error(r.stderr)
    assert line.startswith(f"error: --ps-hosts {host}:"), line
    assert "no authentication" in line and "--allow-remote" in line, line
    assert "serving" not in r.stdout


def _wide_address() -> str | None:
    """An address of this machine beyond loopback, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


@pytest.mark.skipif(_wide_address() is None, reason="no address beyond loopback on this machine")
def test_with_allow_remote_a_task_listens_on_the_address_its_host_names_not_everywhere():
    host, ps = _wide_address(), free_tcp_port()
    serve_then_stop(task_args("ps", f"{host}:{ps}", f"127.0.0.1:{free_tcp_port()}", "--allow-remote"), ps, [host])


@pytest.mark.parametrize("job", ["ps", "worker"])
def test_a_task_whose_port_is_taken_is_one_line_before_it_says_it_serves(job):
    with taken_port() as port:
        busy = f"127.0.0.1:{port}"
        other = f"127.0.0.1:{free_tcp_port()}"
        args = task_args(job, busy, other) if job == "ps" else task_args(job, other, busy)
        r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 2, r.stderr[-2000:]
    assert one_error(r.stderr) == f"error: {job} 0: cannot listen on {busy}: address already in use"
    assert "serving" not in r.stdout
