"""The run stopped from outside: a signal or SIGKILL to the run, or a rank killed, in every phase.

SIGINT and SIGTERM during the baseline, mid-run, while waiting for an external producer, or to a run started with
SIGINT ignored end in one line and the signal's exit code; SIGKILL to the TensorFlow run or to torchrun takes its
producers, ranks and socket folder with it; a killed PyTorch rank ends the run naming the rank, path and endpoint.
Nothing of the run is left running or in its temporary folder, and no partial result file is written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest
from conftest import descendants
from failing_runs import (
    FAULT_RUN,
    SMALL,
    TORCH_LONG,
    cmdline,
    is_rank,
    needs_torch,
    one_error_line,
    run_folders,
    start,
    wait_for_line,
    wait_for_producers,
    wait_until_steps,
)

pytestmark = pytest.mark.timeout(240)


def assert_interrupted(p: subprocess.Popen, sig: int, tmp_path) -> None:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err[-3000:]
    assert len([ln for ln in err.splitlines() if "interrupted" in ln]) == 1, err[-3000:]
    assert not list((tmp_path / "tmp").iterdir()), "the run's temporary files must be removed"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_baseline_is_one_line_and_the_signal_exit_code(procs, tmp_path, sig):
    p = start(procs, tmp_path, "--fake-location", "gpu", *SMALL, "--steps", "100000", "--repeats", "1")
    wait_for_line(p, "- gpu ...")
    time.sleep(2.0)
    p.send_signal(sig)
    assert_interrupted(p, sig, tmp_path)


def test_sigint_stops_a_run_started_with_sigint_ignored(procs, tmp_path):
    """`cmd &` in a script starts the run with SIGINT ignored; a deliberate SIGINT must still stop it."""
    p = start(
        procs, tmp_path, "--fake-location", "gpu", *SMALL, "--steps", "100000", "--repeats", "1",
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    wait_for_line(p, "- gpu ...")
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    assert_interrupted(p, signal.SIGINT, tmp_path)


def test_a_signal_while_waiting_for_an_external_producer(procs, tmp_path, ipc_dir):
    p = start(procs, tmp_path, "--fake-location", "python-queue", *SMALL, "--warmup-steps", "1", "--steps", "1",
              "--repeats", "1", "--endpoint", f"ipc://{ipc_dir}/ext", "--recv-timeout", "600")  # fmt: skip
    wait_for_line(p, "waiting for an external producer")
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    assert_interrupted(p, signal.SIGTERM, tmp_path)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_run_stops_everything_and_writes_nothing(procs, tmp_path, sig):
    out_json = tmp_path / "r.json"
    run = procs.start("bench_input.py", "--fake-location", "python-queue", *FAULT_RUN, "--steps", "1000", "--repeats", "1",
                      "--producer-rate", "4", "--producers", "2", "--json", str(out_json))  # fmt: skip
    wait_for_producers(run.pid, 2)
    time.sleep(1.0)  # let it get into the measured steps
    everything = descendants(run.pid)
    run.send_signal(sig)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 128 + sig, err
    assert "interrupted" in err
    assert not psutil.wait_procs(everything, timeout=15)[1], "a process of the run outlived it"
    assert not list(tmp_path.iterdir()), "no result file, not even a partial one"


# A trainer that dies takes its producers and its socket folder with it.
FAST = ["--input-only", "--batch", "2", "--image-size", "32", "--warmup-steps", "1", "--repeats", "1"]


def kill_all(ps: list[psutil.Process]) -> None:
    for p in ps:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.mark.timeout(180)
def test_a_trainer_killed_with_sigkill_takes_its_producers_and_socket_folder_with_it(procs, ipc_dir):
    env = {**os.environ, "TMPDIR": ipc_dir}  # the run's socket folder goes here, where we can see it
    # Slow producers keep the run in its python-queue steps (the gpu baseline before it is quick).
    run = procs.start("bench_input.py", "--fake-location", "python-queue", *FAST, "--steps", "1000",
                      "--producers", "2", "--producer-workers", "2", "--producer-rate", "4", env=env)  # fmt: skip
    tops = wait_for_producers(run.pid, 2, timeout=90)
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


@pytest.mark.timeout(400)
@needs_torch
def test_sigkill_of_the_run_takes_torchrun_the_ranks_and_their_producers_with_it(procs, tmpdir_env):
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", *TORCH_LONG, "--fake-location", "python-queue", env=env)
    wait_until_steps(run.pid)
    everything = descendants(run.pid)
    assert sum(is_rank(p) for p in everything) == 2, "the ranks are running"
    run.kill()
    run.wait()
    # torchrun's launcher follows the run; the ranks follow the launcher; the producers their rank.
    left = psutil.wait_procs(everything, timeout=60)[1]
    assert not left, [cmdline(p) for p in left]
    deadline = time.monotonic() + 20
    while run_folders(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run_folders(tmp), "the killed run's folder was left behind"


@pytest.mark.timeout(400)
@needs_torch
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_run_with_one_line_and_leaves_nothing(procs, tmpdir_env, tmp_path, sig):
    tmp, env = tmpdir_env
    out_json = tmp_path / "r.json"
    run = procs.start(
        "bench_input.py", *TORCH_LONG, "--fake-location", "python-queue", "--json", str(out_json), env=env
    )
    wait_until_steps(run.pid)
    everything = descendants(run.pid)
    run.send_signal(sig)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 128 + sig, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [f"interrupted ({signal.Signals(sig).name}): stopping producers; no results written"], err
    assert not psutil.wait_procs(everything, timeout=30)[1], "a process of the run outlived it"
    assert not run_folders(tmp), "the run's folder was left behind"
    assert not out_json.exists()


@pytest.mark.timeout(400)
@needs_torch
def test_a_killed_rank_ends_the_run_with_one_line_naming_the_rank_path_and_endpoint(procs, tmpdir_env):
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", *TORCH_LONG, "--fake-location", "python-queue", env=env)
    wait_until_steps(run.pid)
    ranks = [p for p in descendants(run.pid) if is_rank(p)]
    assert len(ranks) == 2
    everything = descendants(run.pid)
    victim = ranks[1]
    victim.kill()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = one_error_line(err)
    assert line.startswith("error: python-queue: ipc://"), line
    assert f"(pid {victim.pid}) exited, killed by SIGKILL" in line, line
    assert not psutil.wait_procs(everything, timeout=30)[1]
    assert not run_folders(tmp)
