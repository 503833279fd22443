"""Failures a user can meet, each ending in one line that names its cause and leaving nothing behind.

Real processes, real sockets, real signals: a trainer killed with SIGKILL, producers that die at
start or are killed, a sender of garbage, ipc paths that are taken, too long, or unreachable.
docs/reliability.md lists the same failures with the lines they print.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq
from conftest import descendants

from consumers.zmq_pull import PullConsumer
from core.config import BenchConfig, apply_defaults
from core.errors import InputError
from harness.tf.run import run_path
from producers.commands import producer_argv as producer_command
from runner.producer_group import ProducerGroup
from wire import message
from wire.endpoints import EndpointError

pytestmark = pytest.mark.timeout(180)

FAST = ["--input-only", "--batch", "2", "--image-size", "32", "--warmup-steps", "1", "--repeats", "1"]


def small(**kw) -> BenchConfig:
    base = {"batch": 2, "image_size": 32, "num_gpus": 1, "warmup_steps": 1, "steps": 2, "repeats": 1}
    cfg = BenchConfig(**{"producers": 1, "input_only": True, "recv_timeout": 60, **base, **kw})
    apply_defaults(cfg, gpus=0)
    return cfg


def _is_producer_of(p: psutil.Process, pid: int) -> bool:
    try:
        return p.ppid() == pid and "producers" in " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie not yet reaped
        return False


def producers_of(pid: int, n: int, timeout: float = 90) -> list[psutil.Process]:
    """The run's producer processes (not their workers), once n of them are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tops = [p for p in descendants(pid) if _is_producer_of(p, pid)]
        if len(tops) >= n:
            return tops
        time.sleep(0.1)
    raise AssertionError(f"{n} producers did not start")


def kill_all(ps: list[psutil.Process]) -> None:
    for p in ps:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


# A trainer that dies takes its producers and its socket folder with it.


def test_a_trainer_killed_with_sigkill_takes_its_producers_and_socket_folder_with_it(procs, ipc_dir):
    env = {**os.environ, "TMPDIR": ipc_dir}  # the run's socket folder goes here, where we can see it
    # Slow producers keep the run in its python-queue steps (the gpu baseline before it is quick).
    run = procs.start("bench_input.py", "--fake-location", "python-queue", *FAST, "--steps", "1000",
                      "--producers", "2", "--producer-workers", "2", "--producer-rate", "4", env=env)  # fmt: skip
    tops = producers_of(run.pid, 2)
    while not [d for d in os.listdir(ipc_dir) if d.startswith("feedbench-")]:
        time.sleep(0.1)
    deadline = time.monotonic() + 60
    while len(descendants(run.pid)) < 6 and time.monotonic() < deadline:  # two producers, two workers each
        time.sleep(0.1)
    time.sleep(1.0)  # into the steps: the workers are sending
    everything = descendants(run.pid)
    assert len(everything) >= 6, "two producers with two workers each"
    run.kill()
    run.wait()
    try:
        # Producers watch their parent: they go within a second or so, not after their 60 s give-up timer.
        left = psutil.wait_procs(everything, timeout=20)[1]
        assert not left, f"{len(left)} producer processes outlived the killed trainer"
        deadline = time.monotonic() + 10
        while os.listdir(ipc_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.listdir(ipc_dir), "the killed run's socket folder was left behind"
    finally:
        kill_all(everything + tops)


def test_a_producer_whose_run_is_already_gone_exits_and_removes_only_sockets(procs, ipc_dir):
    """The race the kernel's death signal leaves open: the run died before the producer asked for it."""
    run_dir = Path(ipc_dir) / "run"
    run_dir.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(run_dir / "python-queue"))
    stale.close()
    (run_dir / "notes.txt").write_text("not the producer's to remove")
    env = {**os.environ, "FEEDBENCH_PARENT_PID": "1", "FEEDBENCH_RUN_DIR": str(run_dir)}  # not its parent
    p = procs.start("-m", "producers", "synthetic", "--endpoint", f"ipc://{run_dir}/python-queue", "--quiet", env=env)
    p.communicate(timeout=30)  # not the 60 s a producer without a consumer waits before giving up
    assert p.returncode == 128 + signal.SIGTERM
    assert sorted(os.listdir(run_dir)) == ["notes.txt"], "the socket goes, the rest stays"


# A producer that dies before its first batch is reported at once, with its own last line.


@pytest.mark.parametrize("path", ["python-queue", "python-dataset", "zmq-consume"])
def test_a_producer_that_dies_at_start_is_reported_with_its_own_line(tmp_path, path):
    empty = tmp_path / "empty"
    empty.mkdir()
    # recv_timeout 100 s: the run must not wait for it to say why (the test's own timeout is shorter).
    cfg = small(producer_kind="decode", data=str(empty), recv_timeout=100)
    with pytest.raises(InputError) as e:
        run_path(cfg, path, False)
    line = str(e.value)
    assert "\n" not in line
    assert re.fullmatch(
        rf"{path}: ipc://\S+/{path}: producer 0 exited with code 2: error: dataset folder {empty} is empty", line
    ), line


def test_a_killed_producer_is_reported_as_killed_by_sigkill(ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as consumer:
        cmd = producer_command("synthetic", endpoint, 0, 2, 16, "native", 2, 4)
        group = ProducerGroup([cmd], endpoint).start()
        try:
            consumer.recv()
            os.kill(group.procs[0].pid, signal.SIGKILL)
            group.procs[0].wait()
            line = group.exited()[0]
        finally:
            group.stop()
    assert line == "producer 0 exited, killed by SIGKILL"


# Bad messages from an external sender: one line naming the path, the endpoint and the field.

GARBAGE = textwrap.dedent(
    """
    import os, sys, time, zmq
    kind = sys.argv[2]
    message = {"magic": b"FEED" + bytes(60), "empty": b"", "random": os.urandom(300),
               "huge": (1).to_bytes(4, "little") + (4).to_bytes(4, "little") + (1).to_bytes(4, "little")
                       + (2).to_bytes(4, "little") + (1 << 40).to_bytes(8, "little")}[kind]
    sock = zmq.Context().socket(zmq.PUSH)
    sock.connect(sys.argv[1])
    while True:
        sock.send(message)
        time.sleep(0.05)
    """
)


@pytest.mark.parametrize(
    "path, kind, what",
    [
        ("python-queue", "magic", r"n_tensors: \d+ is outside"),
        ("python-dataset", "empty", r"message is empty|truncated|n_tensors"),
        ("zmq-consume", "random", r"bad zmq_ops message: "),
        ("python-dataset", "huge", r"nbytes"),
    ],
)
def test_garbage_from_an_external_sender_ends_the_run_in_one_line_naming_the_field(
    procs, ipc_dir, capfd, path, kind, what
):
    endpoint = f"ipc://{ipc_dir}/ext"
    procs.start("-c", GARBAGE, endpoint, kind)
    with pytest.raises(InputError) as e:
        run_path(small(endpoint=endpoint), path, False)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{path}: {endpoint}: "), line
    assert re.search(what, line), line
    assert "Traceback" not in capfd.readouterr().err, "no feeding-thread traceback on the way"
    assert not os.path.exists(endpoint[len("ipc://") :]), "the run removes the socket file it bound"


def test_silence_on_python_dataset_is_a_plain_timeout_not_an_unknown_error(ipc_dir, capfd):
    endpoint = f"ipc://{ipc_dir}/quiet"
    with pytest.raises(InputError) as e:
        run_path(small(endpoint=endpoint, recv_timeout=1), "python-dataset", False)
    assert str(e.value) == f"python-dataset: {endpoint}: no batch within 1 s"
    assert "Traceback" not in capfd.readouterr().err


# ipc endpoints: not taken over, not too long, not inproc for a producer; nothing left behind.


def test_a_second_bind_on_a_live_ipc_path_is_address_in_use(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/taken"
    with PullConsumer(endpoint, recv_timeout=1):
        with pytest.raises(EndpointError, match="cannot bind: address already in use"):
            PullConsumer(endpoint)
        second = procs.producer(endpoint, "--bind", "--batch", "2", "--image-size", "8")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2
        assert err.strip() == f"error: endpoint {endpoint!r}: cannot bind: address already in use"
        assert os.path.exists(f"{ipc_dir}/taken"), "the refused bind left the live socket's file alone"
    assert not os.path.exists(f"{ipc_dir}/taken"), "the consumer removes its socket file when it closes"


def test_a_stale_ipc_socket_file_is_reused(ipc_dir):
    path = f"{ipc_dir}/stale"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens: what a crashed process leaves
    endpoint = f"ipc://{path}"
    with PullConsumer(endpoint, recv_timeout=30) as consumer:
        with zmq.Context() as ctx, ctx.socket(zmq.PUSH) as push:
            push.connect(endpoint)
            message.send(push, [np.zeros(4, np.uint8)], "zmq_ops", 0, 0, None)
            assert consumer.recv() is not None


def test_an_ipc_path_longer_than_the_os_allows_is_refused_in_one_line(procs):
    endpoint = "ipc:///tmp/" + "x" * 120
    p = procs.producer(endpoint)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert err.strip() == (
        f"error: endpoint {endpoint!r}: the socket path is 125 bytes, longer than the 107 the OS allows"
    )


def test_a_long_tmpdir_still_gives_the_run_short_socket_paths(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    result = run_path(small(), "python-queue", False)
    assert result["images_per_sec"]["median"] > 0


def test_inproc_is_refused_for_a_producer(procs):
    p = procs.producer("inproc://feed")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert err.strip().startswith("error: endpoint 'inproc://feed': inproc:// reaches only sockets inside one process")


def test_a_producer_group_killed_with_sigkill_leaves_no_semaphores(ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as consumer:
        producer = subprocess.Popen(
            [sys.executable, "-m", "producers", "synthetic", "--endpoint", endpoint, "--workers", "2",
             "--batch", "2", "--image-size", "8", "--quiet"],
            cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
        )  # fmt: skip
        try:
            for _ in range(4):
                consumer.recv()
            group = [psutil.Process(producer.pid), *descendants(producer.pid)]
            mapped = set()
            for p in group:
                mapped |= {m.path for m in p.memory_maps() if "/dev/shm/sem." in m.path}
            os.killpg(producer.pid, signal.SIGKILL)
            producer.wait()
            psutil.wait_procs(group, timeout=10)
        finally:
            if producer.poll() is None:
                os.killpg(producer.pid, signal.SIGKILL)
                producer.wait()
    left = [m for m in mapped if os.path.exists(m)]
    assert not left, f"named semaphores left in /dev/shm: {left}"
