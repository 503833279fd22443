"""Faults during a run: producers dying, the run being stopped; nothing hangs, nothing is left behind."""

from __future__ import annotations

import signal
import time

import psutil
import pytest
from conftest import descendants

pytestmark = pytest.mark.timeout(360)  # the gpu baseline runs its 100000 steps first

# One tower: what these runs check (producers dying, signals) happens before and beside the towers.
FAST = ["--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "32", "--warmup-steps", "1",
        "--recv-timeout", "120"]  # fmt: skip
# The run's 1000 steps include the gpu baseline's, which are quick; --producer-rate keeps the path under test busy.


def _is_producer_of(p: psutil.Process, pid: int) -> bool:
    try:
        return p.ppid() == pid and "producers" in " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie not yet reaped (a short-lived helper process)
        return False


def wait_for_producers(pid: int, n: int, timeout: float = 180) -> list[psutil.Process]:
    """The run's producer processes (not their workers), once n of them are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tops = [p for p in descendants(pid) if _is_producer_of(p, pid)]
        if len(tops) >= n:
            return tops
        time.sleep(0.1)
    raise AssertionError(f"{n} producers did not start")


def test_a_dead_producer_stops_the_run_naming_its_endpoint(procs, tmp_path):
    out_json = tmp_path / "r.json"
    run = procs.start("bench_input.py", "--fake-location", "zmq-consume", *FAST, "--steps", "1000", "--repeats", "1",
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


def test_with_continue_the_run_trains_on_with_the_other_producers(procs, tmp_path):
    run = procs.start("bench_input.py", "--fake-location", "zmq-consume", *FAST, "--steps", "3000", "--repeats", "2",
                      "--producers", "2", "--on-producer-exit", "continue")  # fmt: skip
    victim = wait_for_producers(run.pid, 2)[1]
    everything = descendants(run.pid)
    victim.kill()
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    assert "continuing with the other producers" in out
    assert "zmq-consume" in out.split("input path")[-1]
    assert not psutil.wait_procs(everything, timeout=15)[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_run_stops_everything_and_writes_nothing(procs, tmp_path, sig):
    out_json = tmp_path / "r.json"
    run = procs.start("bench_input.py", "--fake-location", "python-queue", *FAST, "--steps", "1000", "--repeats", "1",
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
