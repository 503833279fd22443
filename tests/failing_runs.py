"""What the tests of failing runs share: starting a run as a user would, finding its producers and ranks, reading
its one error line.

The runs are real (`bench_input.py`, `python -m producers`, torchrun's ranks); these helpers only start them, find
their processes by command line and parent, and check that stderr ends in one `error:` line and no traceback.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time

import psutil
import pytest
from conftest import descendants

from core.config import BenchConfig, apply_defaults

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")


SMALL = ["--num-gpus", "1", "--batch", "2", "--image-size", "32", "--input-only"]


def start(procs, tmp_path, *args: str, **kw) -> subprocess.Popen:
    """bench_input.py with its own TMPDIR, so what it leaves behind can be seen."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return procs.start("bench_input.py", *args, env={**os.environ, "TMPDIR": str(tmp)}, **kw)


def wait_for_line(p: subprocess.Popen, words: str, timeout: float = 180) -> list[str]:
    """Read the run's stdout until a line holds `words`; the lines read so far."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        if words in line:
            return seen
    raise AssertionError(f"no line with {words!r}; got {''.join(seen)!r}")


def one_error(err: str) -> str:
    """The one `error` line of a failed run, which must have no traceback."""
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def small(**kw) -> BenchConfig:
    """A one-tower, one-producer, two-step input-only config, as the TensorFlow trainer takes it after its defaults."""
    base = {"batch": 2, "image_size": 32, "num_gpus": 1, "warmup_steps": 1, "steps": 2, "repeats": 1}
    cfg = BenchConfig(**{"producers": 1, "input_only": True, "recv_timeout": 60, **base, **kw})
    apply_defaults(cfg, gpus=0)
    return cfg


# One tower: what these runs check (producers dying, signals) happens before and beside the towers.
FAULT_RUN = ["--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "32", "--warmup-steps", "1",
             "--recv-timeout", "120"]  # fmt: skip


def is_producer_of(p: psutil.Process, pid: int) -> bool:
    """A producer the run `pid` started itself (not one of its workers)."""
    try:
        return p.ppid() == pid and "producers" in " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie not yet reaped (a short-lived helper process)
        return False


def wait_for_producers(pid: int, n: int, timeout: float = 180) -> list[psutil.Process]:
    """The run's producer processes (not their workers), once n of them are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tops = [p for p in descendants(pid) if is_producer_of(p, pid)]
        if len(tops) >= n:
            return tops
        time.sleep(0.1)
    raise AssertionError(f"{n} producers did not start")


# Two CPU ranks, input only, long enough that the path under test is still running when the test acts.
TORCH_RUN = ["--framework", "torch", "--input-only", "--num-gpus", "2", "--batch", "2", "--image-size", "32",
             "--warmup-steps", "1", "--repeats", "1", "--recv-timeout", "120"]  # fmt: skip


# The run's 1000 steps include the gpu baseline's, which are quick; --producer-rate keeps the path under test busy.
TORCH_LONG = [*TORCH_RUN, "--steps", "1000", "--producer-rate", "4", "--producers", "2"]


def cmdline(p: psutil.Process) -> str:
    """The process's command line, or "" once it is gone."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def is_rank(p: psutil.Process) -> bool:
    """A rank (python -m harness.torch.run), not torchrun's launcher, whose arguments name it too."""
    line = cmdline(p)
    return "-m harness.torch.run" in line


def is_producer(p: psutil.Process) -> bool:
    """A producer a rank started (its workers, forked from it, carry the same command line)."""
    try:
        return "-m producers" in cmdline(p) and is_rank(p.parent() or p)
    except psutil.Error:
        return False


def sending(p: psutil.Process) -> bool:
    """The producer has started its worker, the process that connects and sends."""
    try:
        return bool(p.children())
    except psutil.Error:
        return False


def wait_for_rank_producers(pid: int, n: int, timeout: float = 240) -> list[psutil.Process]:
    """The producers the run's ranks started, once n of them have started their workers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in descendants(pid) if is_producer(p) and sending(p)]
        if len(found) >= n:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{n} producers did not start their workers")


def wait_until_steps(pid: int) -> None:
    """The run's producers are up and sending (two, one per rank): the producer path has started."""
    wait_for_rank_producers(pid, 2)


def run_folders(tmp: str) -> list[str]:
    """The run folders (sockets, rank files) and its producers' TMPDIRs (fb-*) left in TMPDIR `tmp`."""
    return [d for d in os.listdir(tmp) if d.startswith(("feedbench-", "fb-"))]


def one_error_line(err: str) -> str:
    """The whole stderr of a failed PyTorch run: one `error: ` line, no traceback, no torchrun report."""
    assert "Traceback" not in err and "ChildFailedError" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]
