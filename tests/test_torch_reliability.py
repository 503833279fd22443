"""The PyTorch trainer when things go wrong: the run killed or stopped, a producer or a rank killed, batches of
the wrong layout, a batch that cannot fit in memory. Real processes, real signals: each case ends with one line
(or none, for SIGKILL), the documented exit code, and nothing of the run left running or on disk."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from conftest import descendants, only_these_hold

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(400)

# Two CPU ranks, input only, long enough that the path under test is still running when the test acts.
RUN = ["--framework", "torch", "--input-only", "--num-gpus", "2", "--batch", "2", "--image-size", "32",
       "--warmup-steps", "1", "--repeats", "1", "--recv-timeout", "120"]  # fmt: skip
LONG = [*RUN, "--steps", "1000", "--producer-rate", "4", "--producers", "2"]


def cmdline(p: psutil.Process) -> str:
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


def wait_for_producers(pid: int, n: int, timeout: float = 240) -> list[psutil.Process]:
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
    wait_for_producers(pid, 2)


def run_folders(tmp: str) -> list[str]:
    return [d for d in os.listdir(tmp) if d.startswith("feedbench-")]


@pytest.fixture
def tmpdir_env(ipc_dir):
    """TMPDIR for the run: its folder (sockets, rank files) goes where the test can see it."""
    return ipc_dir, {**os.environ, "TMPDIR": ipc_dir}


def test_sigkill_of_the_run_takes_torchrun_the_ranks_and_their_producers_with_it(procs, tmpdir_env):
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", *LONG, "--fake-location", "python-queue", env=env)
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_run_with_one_line_and_leaves_nothing(procs, tmpdir_env, tmp_path, sig):
    tmp, env = tmpdir_env
    out_json = tmp_path / "r.json"
    run = procs.start("bench_input.py", *LONG, "--fake-location", "python-queue", "--json", str(out_json), env=env)
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


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err and "ChildFailedError" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("path", ["python-queue", "python-dataset", "zmq-consume"])
def test_a_killed_producer_ends_the_run_with_one_line_naming_the_path_and_endpoint(procs, tmpdir_env, path):
    """The rank waiting for that producer's batches notices at once, not after the 120 s receive timeout."""
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", *LONG, "--fake-location", path, env=env)
    producers = wait_for_producers(run.pid, 2)
    everything = descendants(run.pid)
    producers[0].kill()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = _one_error_line(err)
    assert line.startswith(f"error: {path}: ipc://") and f"/{path}" in line and ": producer " in line, line
    assert "killed by SIGKILL" in line, line
    left = psutil.wait_procs(everything, timeout=30)[1]
    assert not left, [cmdline(p) for p in left]
    assert not run_folders(tmp)


def test_a_killed_rank_ends_the_run_with_one_line_naming_the_rank_path_and_endpoint(procs, tmpdir_env):
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", *LONG, "--fake-location", "python-queue", env=env)
    wait_until_steps(run.pid)
    ranks = [p for p in descendants(run.pid) if is_rank(p)]
    assert len(ranks) == 2
    everything = descendants(run.pid)
    victim = ranks[1]
    victim.kill()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = _one_error_line(err)
    assert line.startswith("error: python-queue: ipc://"), line
    assert f"(pid {victim.pid}) exited, killed by SIGKILL" in line, line
    assert not psutil.wait_procs(everything, timeout=30)[1]
    assert not run_folders(tmp)


# An external producer of odd batches, built on the project's wire code (native format, producer 5).
ODD_SENDER = """
import sys
import numpy as np
import zmq
from wire import message

endpoint, kind = sys.argv[1], sys.argv[2]
sock = zmq.Context.instance().socket(zmq.PUSH)
sock.connect(endpoint)
size = 48 if kind == "size" else 32
batch = 3 if kind == "batch" else 2
images = np.zeros((batch, size, size, 3), np.float32 if kind == "dtype" else np.uint8)
arrays = [images, np.zeros(batch, np.int32)] + ([np.zeros(batch, np.int32)] if kind == "count" else [])
seq = 0
while True:
    message.send(sock, arrays, producer_id=5, seq=seq)
    seq += 1
"""

MISMATCH = [
    ("python-queue", "size", ["producer 5", "uint8 [2,48,48,3]", "the run expects uint8 [2,32,32,3], int32 [2]"]),
    ("python-queue", "batch", ["producer 5", "uint8 [3,32,32,3], int32 [3]", "expects uint8 [2,32,32,3]"]),
    ("python-queue", "dtype", ["producer 5", "float32 [2,32,32,3]", "expects uint8 [2,32,32,3]"]),
    ("python-queue", "count", ["producer 5", "int32 [2], int32 [2]; the run expects"]),
    ("python-dataset", "size", ["producer 5", "uint8 [2,48,48,3]", "the run expects uint8 [2,32,32,3], int32 [2]"]),
    ("python-dataset", "batch", ["producer 5", "int32 [3]", "expects uint8 [2,32,32,3], int32 [2]"]),
    ("python-dataset", "dtype", ["producer 5", "float32 [2,32,32,3]", "expects uint8 [2,32,32,3]"]),
    ("python-dataset", "count", ["producer 5", "int32 [2], int32 [2]; the run expects"]),
    ("zmq-consume", "size", ["48"]),
    ("zmq-consume", "dtype", ["float"]),
    ("zmq-consume", "count", ["3"]),
]
# One launch per input path: each path turns its refusal into the run's line on its own code path.
LAUNCHED = [MISMATCH[0], MISMATCH[5], MISMATCH[9]]


@pytest.mark.parametrize("path, kind, words", LAUNCHED, ids=[f"{p}-{k}" for p, k, _ in LAUNCHED])
def test_a_producer_of_the_wrong_layout_is_refused_on_every_path(procs, ipc_dir, tmp_path, path, kind, words):
    """The whole run, once per path: exit 2, one line naming path, endpoint and layouts, no JSON, nothing left.

    Every other kind of wrong batch is refused by the same receiving code, checked in-process below.
    """
    endpoint = f"ipc://{ipc_dir}/ext"
    rank0 = f"{endpoint}-r0" + ("-w0" if path == "python-dataset" else "")  # rank 0's endpoint (worker 0's)
    external = procs.start("-c", ODD_SENDER, rank0, kind)
    out_json = tmp_path / "r.json"
    run = procs.start(
        "bench_input.py", *RUN, "--num-gpus", "1", "--steps", "4", "--producers", "1", "--fake-location", path,
        "--endpoint", endpoint, "--json", str(out_json), "--recv-timeout", "600",
    )  # fmt: skip
    out, err = run.communicate(timeout=300)
    assert run.returncode == 2, (out, err)
    line = _one_error_line(err)
    assert line.startswith(f"error: {path}: {rank0}"), line
    for w in words:
        assert w in line, line
    assert "no batch" not in line
    assert not out_json.exists()
    assert only_these_hold(endpoint, external.pid)


def refusal(path: str, folder: str) -> str:
    """What rank 0's receiving code raises on the first batch an external producer sends to it in `folder`."""
    import torch

    from consumers import declared
    from consumers.expect import receive_cap
    from consumers.python_dataset.torch import PullDataset
    from consumers.torch_half import RankContext
    from core.config import BenchConfig

    cfg = BenchConfig(paths=[path], num_gpus=1, batch=2, image_size=32, producers=1, input_only=True)
    endpoint = f"ipc://{folder}/ext"
    cfg.endpoint, cfg.recv_timeout, cfg.max_msg_size = endpoint, 600.0, receive_cap(2, 32)
    if path == "python-dataset":  # what each loader worker runs, here without the loader's process around it
        source = PullDataset([f"{endpoint}-r0-w0"], cfg)
        with pytest.raises(ValueError) as e:
            next(iter(source))
        return str(e.value)
    reader = declared.get("torch", path)(cfg)  # the path a rank opens, reading rank 0's endpoint
    try:
        reader.open(RankContext(0, 1, 0, torch.device("cpu"), folder))
        with pytest.raises(ValueError) as e:
            reader.next()
    finally:
        reader.close()
    return str(e.value)


@pytest.mark.parametrize("path, kind, words", MISMATCH, ids=[f"{p}-{k}" for p, k, _ in MISMATCH])
def test_every_wrong_layout_is_named_by_the_code_that_receives_it(procs, ipc_dir, path, kind, words):
    """Each kind of wrong batch, on each path, sent by a real producer process to the rank's real receiver."""
    endpoint = f"ipc://{ipc_dir}/ext"
    rank0 = f"{endpoint}-r0" + ("-w0" if path == "python-dataset" else "")
    procs.start("-c", ODD_SENDER, rank0, kind)
    message = refusal(path, ipc_dir)
    for w in words:
        assert w in message, message
    assert "no batch" not in message


def test_a_batch_that_cannot_fit_in_memory_is_refused_before_anything_starts(procs, tmpdir_env):
    """ResNet-50 at batch 20000 of 64x64 needs about 200 GB of activations per rank; the batches alone fit."""
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", "--framework", "torch", "--num-gpus", "2", "--fake-location", "python-queue",
                      "--batch", "20000", "--image-size", "64", env=env)  # fmt: skip
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = _one_error_line(err)
    assert line.startswith("error: --batch 20000 at --image-size 64: 2 rank(s) need about "), line
    assert "GB of memory (activations 204.8 GB per rank)" in line and "GB available" in line, line
    assert "feedbench (PyTorch" not in out, "the run did not start"
    assert not run_folders(tmp)


def test_the_estimate_grows_with_batch_and_pixels_and_fits_small_runs():
    from runner import memory

    small = memory.estimate(4, 64, 2, 0)
    assert memory.check(small, 8e9, None, "x", 2) is None
    big = memory.estimate(400, 64, 2, 0)
    assert big.activations == pytest.approx(100 * small.activations)
    assert memory.estimate(4, 128, 2, 0).activations == pytest.approx(4 * small.activations)
    gpu = memory.estimate(2048, 224, 1, 1)
    line = memory.check(gpu, 1e12, 80e9, "--batch 2048 at --image-size 224", 1)
    assert line and "on its GPU" in line and "80.0 GB" in line
