"""A producer that dies, is killed, stalls or goes on alone: the run ends in one line naming it, or trains on.

Real producer processes of both trainers, fed from real sockets: a producer dying at start or killed with SIGKILL
(reported as such, with its path and endpoint), a producer whose run is already gone (it exits and removes only its
sockets), a silent producer (a plain receive timeout), `--continue` training on with the others, a killed producer
group leaving no semaphores, and producer flags at absurd values ending cleanly. docs/reliability.md lists the lines.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import descendants
from failing_runs import (
    FAULT_RUN,
    TORCH_LONG,
    cmdline,
    needs_torch,
    one_error_line,
    run_folders,
    small,
    wait_for_producers,
    wait_for_rank_producers,
)
from path_lists import producer_paths
from test_loader import finish, start

from consumers.zmq_pull import PullConsumer
from core.errors import InputError
from harness.tf.run import run_path
from producers.commands import producer_argv as producer_command
from runner.producer_group import ProducerGroup

pytestmark = pytest.mark.timeout(180)


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
@pytest.mark.parametrize("path", producer_paths("tf"))
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


@pytest.mark.timeout(360)
def test_a_dead_producer_stops_the_run_naming_its_endpoint(procs, tmp_path):
    out_json = tmp_path / "r.json"
    run = procs.start("bench_input.py", "--fake-location", "zmq-consume", *FAULT_RUN, "--steps", "1000", "--repeats", "1",
                      "--producer-rate", "4", "--producers", "2", "--json", str(out_json))  # fmt: skip
    victim = wait_for_producers(run.pid, 2)[0]
    everything = descendants(run.pid)
    victim.kill()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = [ln for ln in err.splitlines() if ln.startswith("error")][-1]
    assert "producer" in line and "ipc://" in line and "exited" in line
    assert not out_json.exists()
    assert not psutil.wait_procs(everything, timeout=15)[1], "a producer or worker outlived the run"


@pytest.mark.timeout(360)
def test_with_continue_the_run_trains_on_with_the_other_producers(procs, tmp_path):
    run = procs.start("bench_input.py", "--fake-location", "zmq-consume", *FAULT_RUN, "--steps", "3000", "--repeats", "2",
                      "--producers", "2", "--on-producer-exit", "continue")  # fmt: skip
    victim = wait_for_producers(run.pid, 2)[1]
    everything = descendants(run.pid)
    victim.kill()
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    assert "continuing with the other producers" in out
    assert "zmq-consume" in out.split("input path")[-1]
    assert not psutil.wait_procs(everything, timeout=15)[1]


@pytest.mark.timeout(400)
@needs_torch
@pytest.mark.parametrize("path", producer_paths("torch"))
def test_a_killed_producer_ends_the_run_with_one_line_naming_the_path_and_endpoint(procs, tmpdir_env, path):
    """The rank waiting for that producer's batches notices at once, not after the 120 s receive timeout."""
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", *TORCH_LONG, "--fake-location", path, env=env)
    producers = wait_for_rank_producers(run.pid, 2)
    everything = descendants(run.pid)
    producers[0].kill()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = one_error_line(err)
    assert line.startswith(f"error: {path}: ipc://") and f"/{path}" in line and ": producer " in line, line
    assert "killed by SIGKILL" in line, line
    left = psutil.wait_procs(everything, timeout=30)[1]
    assert not left, [cmdline(p) for p in left]
    assert not run_folders(tmp)


def test_silence_on_python_dataset_is_a_plain_timeout_not_an_unknown_error(ipc_dir, capfd):
    endpoint = f"ipc://{ipc_dir}/quiet"
    with pytest.raises(InputError) as e:
        run_path(small(endpoint=endpoint, recv_timeout=1), "python-dataset", False)
    assert str(e.value) == f"python-dataset: {endpoint}: no batch within 1 s"
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.timeout(600)
def test_a_producer_with_an_enormous_give_up_after_or_a_tiny_rate_ends_cleanly(ipc_dir):
    """--give-up-after 1e7 overflowed ZMQ's linger (an int); --rate 1e-300 a sleep; both once batches were sent."""
    endpoint = f"ipc://{ipc_dir}/feed"
    small = ("--batch", "2", "--image-size", "4", "--quiet")
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = start("-m", "producers", "synthetic", "--endpoint", endpoint, "--count", "3", "--give-up-after", "1e7",
                  *small)  # fmt: skip
        for _ in range(3):
            c.recv()
    code, _, err = finish(p, 60)
    assert code == 0 and "Traceback" not in err, err
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = start("-m", "producers", "synthetic", "--endpoint", endpoint, "--rate", "1e-300", *small)
        c.recv()  # the first batch goes at once; the next would be due in 1e300 s
        p.send_signal(signal.SIGTERM)
        code, _, err = finish(p, 60)
    assert code in (0, 143) and "Traceback" not in err and "Overflow" not in err, err
