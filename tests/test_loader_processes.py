"""The processes around a user's loader: what its callable starts, what a killed process leaves, what a signal stops.

Real runs of `bench_input.py --loader-only` (the sweep, `--tune`, `--epochs`) on small loaders written here, with
real processes killed and interrupted; each test waits for the event it needs (a line printed, a file written, a
process gone), never a fixed time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from consumers.zmq_pull import PullConsumer
from tests.test_loader import error_lines, finish, left_in_session, start

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)

# A DataLoader whose callable starts two processes it never stops: a multiprocessing one (not a daemon) and a
# shell by subprocess; each writes its pid to a file named after it.
CACHE_SERVER = """
import multiprocessing as mp, os, subprocess, time
import numpy as np
from torch.utils.data import DataLoader, Dataset

def serve(folder):
    open(os.path.join(folder, f"mp-{os.getpid()}"), "w").close()
    while True:
        time.sleep(1)

class Images(Dataset):
    transform = [lambda x: x + 1]

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.transform[0](np.zeros((8, 8, 3), np.uint8)), 0

def make(folder, num_workers=0, batch_size=4):
    mp.Process(target=serve, args=(folder,), name="cache-server").start()
    subprocess.Popen(["sh", "-c", f"echo > {folder}/sh-$$; exec sleep 600"])
    return DataLoader(Images(), batch_size=batch_size, num_workers=num_workers)
"""


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def assert_cache_servers_stopped_and_named(p: subprocess.Popen, folder: Path, timeout: float) -> None:
    """The run ended well, named CACHE_SERVER's two processes in one note, and left neither (nor anything else)."""
    code, _, err = finish(p, timeout)
    assert code == 0, err[-3000:]
    assert not error_lines(err)
    notes = [ln for ln in err.splitlines() if "its callable started processes" in ln]
    assert len(notes) == 1, err[-3000:]
    assert "multiprocessing.Process 'cache-server'" in notes[0] and "sleep 600" in notes[0]
    started = [int(f.name.split("-")[1]) for f in folder.iterdir()]
    assert any(f.name.startswith("mp-") for f in folder.iterdir()), started  # the servers did run
    assert [pid for pid in started if running(pid)] == []
    assert left_in_session(p.pid) == []


@pytest.mark.parametrize(
    "mode",
    [
        ["--loader-workers", "1", "--loader-seconds", "0.3"],  # the sweep, then the per-stage timing
        ["--tune", "--target-rate", "1", "--loader-workers", "1", "--loader-seconds", "0.3"],
        ["--epochs", "1"],
    ],
    ids=["sweep", "tune", "epochs"],
)
def test_processes_a_loader_s_callable_starts_are_stopped_and_named_in_every_mode(tmp_path, mode):
    """The run ends (the per-stage timing no longer makes the loader in the run's own process, whose exit would
    wait for the server), --tune makes it (its probe may start children), and every process the callable started
    is gone when the run is, named in one note."""
    (tmp_path / "cache_loader.py").write_text(CACHE_SERVER)
    folder = tmp_path / "pids"
    folder.mkdir()
    p = start(
        "bench_input.py", "--loader", f"{tmp_path}/cache_loader.py:make", "--loader-arg", f"folder={folder}",
        "--loader-only", *mode,
    )  # fmt: skip
    assert_cache_servers_stopped_and_named(p, folder, 120)


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_processes_a_loader_s_callable_starts_are_stopped_and_named_after_a_trainer_run(tmp_path, framework):
    """The `loader` path makes the loader in the trainer's own process (as a training script does): what its
    callable started is stopped when the path ends and named in one note, and the run leaves nothing behind
    (the cache server used to outlive the run, holding its output pipes open)."""
    (tmp_path / "cache_loader.py").write_text(CACHE_SERVER)
    folder = tmp_path / "pids"
    folder.mkdir()
    p = start(
        "bench_input.py", "--framework", framework, "--loader", f"{tmp_path}/cache_loader.py:make",
        "--loader-arg", f"folder={folder}", "--fake-location", "loader", "--input-only", "--num-gpus", "1",
        "--batch", "4", "--image-size", "8", "--warmup-steps", "1", "--steps", "2", "--repeats", "1",
    )  # fmt: skip
    assert_cache_servers_stopped_and_named(p, folder, 240)


# A DataLoader with two worker processes over samples that take 0.25 s each: a worker's first batch comes after a
# second, and an orphaned worker that finishes it then wants a folder in the run's TMPDIR for sending it.
SLOW_SAMPLES = """
import time
import numpy as np
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        time.sleep(0.25)
        return np.zeros((8, 8, 3), np.uint8), 0

def make(num_workers=2, batch_size=4):
    return DataLoader(Slow(), batch_size=batch_size, num_workers=num_workers)
"""


def grandchildren(pid: int) -> list[psutil.Process]:
    """The processes two levels below `pid`: a loader's DataLoader workers, below the loader's process."""
    try:
        return [g for c in psutil.Process(pid).children() for g in c.children() if running(g.pid)]
    except psutil.Error:
        return []


def wait_for(found, what: str, seconds: float = 120.0):
    deadline = time.monotonic() + seconds
    while not (got := found()):
        assert time.monotonic() < deadline, f"no {what} within {seconds:g} s"
        time.sleep(0.05)
    return got


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A TMPDIR with a short path: sockets go in its folders, and a socket's path has at most 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="fbt-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# PyTorch's warning that a DataLoader has more workers than the process's cores (under `taskset -c 0`): the
# loader's own line, machine-dependent, not the run's.
FEW_CORES_WARNING = "ignore:This DataLoader will create:UserWarning"


def loader_run(tmp_path: Path, tmp: Path, loader: str, *flags: str) -> subprocess.Popen:
    """bench_input.py --loader-only on `loader` (a file's text), with TMPDIR `tmp`."""
    (tmp_path / "the_loader.py").write_text(loader)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "PYTHONWARNINGS": FEW_CORES_WARNING}
    p = subprocess.Popen(
        [sys.executable, "bench_input.py", "--loader", f"{tmp_path}/the_loader.py:make", "--loader-only",
         "--no-stages", *flags],
        cwd=ROOT, env=env, start_new_session=True, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    return p


@pytest.mark.parametrize(
    "mode, line",
    [
        (["--epochs", "3"], "the epoch process died (exit code -9)"),
        (["--tune", "--target-rate", "1e9", "--loader-workers", "1", "--loader-seconds", "1"],
         "worker 0 died (exit code -9)"),
    ],
    ids=["epochs", "tune"],
)  # fmt: skip
def test_a_loader_process_killed_by_sigkill_is_one_line_and_its_dataloader_workers_go_first(
    tmp_path, short_tmp, mode, line
):
    """SIGKILL of the process that iterates the loader while its DataLoader has workers: the run says so in its
    one line, and nothing else (the orphaned workers are stopped before the run removes its TMPDIR)."""
    tmp = short_tmp
    p = loader_run(tmp_path, tmp, SLOW_SAMPLES, *mode)
    workers = wait_for(lambda: grandchildren(p.pid), "DataLoader worker")
    loader_process = workers[0].parent()
    loader_process.kill()
    p.wait(120)  # the run's exit: its orphaned DataLoader workers must be gone by then, not seconds later
    assert [w.pid for w in workers if running(w.pid)] == []
    code, _, err = finish(p, 120)
    assert code == 2
    assert err.splitlines() == [f"error: loader {tmp_path}/the_loader.py:make: {line}"], err[-3000:]
    assert left_in_session(p.pid) == []
    assert list(tmp.iterdir()) == []  # TMPDIR/fb-* removed


def test_sigkill_of_the_run_during_tune_leaves_no_tmpdir_and_no_process(tmp_path, short_tmp):
    """The run's process killed while a setting is measured: its loader processes stop (they die with it) and
    remove the run's private TMPDIR (fb-*), which the dead run cannot."""
    tmp = short_tmp
    p = loader_run(tmp_path, tmp, SLOW_SAMPLES, "--tune", "--target-rate", "1e9", "--loader-workers", "1",
                        "--loader-seconds", "1")  # fmt: skip
    wait_for(lambda: grandchildren(p.pid), "DataLoader worker")
    assert [f.name[:3] for f in tmp.iterdir()] == ["fb-"]
    p.kill()
    p.wait(60)
    wait_for(lambda: not any(tmp.iterdir()), "removal of TMPDIR/fb-*", 60)
    assert left_in_session(p.pid) == []


def test_sigkill_of_the_runs_whole_group_during_tune_leaves_no_tmpdir(tmp_path, short_tmp):
    """Every process of the run killed at once (the OOM killer, `kill -9` of each of its groups; between two
    settings the run's own process is all there is): none can remove the run's private TMPDIR (fb-*), yet it
    goes."""
    tmp = short_tmp
    p = loader_run(tmp_path, tmp, SLOW_SAMPLES, "--tune", "--target-rate", "1e9", "--loader-workers", "1",
                        "--loader-seconds", "1")  # fmt: skip
    wait_for(lambda: grandchildren(p.pid), "DataLoader worker")
    assert [f.name[:3] for f in tmp.iterdir()] == ["fb-"]
    for proc in psutil.process_iter():  # the run's session: its own group and each loader process's group
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(proc.pid) == p.pid:
                proc.kill()
    p.wait(60)
    wait_for(lambda: not any(tmp.iterdir()), "removal of TMPDIR/fb-*", 60)
    assert left_in_session(p.pid) == []


def test_sigint_to_the_group_during_epochs_stops_every_loader_process_before_the_run_exits(tmp_path, short_tmp):
    """Ctrl-C at a terminal (SIGINT to the foreground group) mid-epoch: by the time the run has exited, the epoch
    process and its DataLoader workers are gone, and nothing else of it stays."""
    tmp = short_tmp
    p = loader_run(tmp_path, tmp, SLOW_SAMPLES, "--epochs", "3")
    workers = wait_for(lambda: grandchildren(p.pid), "DataLoader worker")
    epoch_process = workers[0].parent()
    os.killpg(p.pid, signal.SIGINT)
    assert p.wait(60) == 130
    assert [q.pid for q in [epoch_process, *workers] if running(q.pid)] == []
    _, err = p.communicate()
    assert err.strip().splitlines() == ["interrupted (SIGINT): stopping producers; no results written"], err
    assert left_in_session(p.pid) == []
    assert list(tmp.iterdir()) == []


def _until_stopped(stop) -> None:
    while not stop.value:  # as a loader worker does between batches
        time.sleep(0.005)


def _stop_at_once(proc, reader, stop, both, errors: list) -> None:
    from runner.loader_only import stop_trees

    both.wait()
    try:
        stop_trees([proc], [reader], stop, "loader.py:make")
    except Exception as e:  # any error is the defect
        errors.append(e)


def test_the_runs_end_and_a_ctrl_c_stopping_the_same_workers_at_once_close_each_pipe_once():
    """A SIGINT's clean-up (the signal watcher's thread) and the run's own ending both stop the epoch process
    and close its pipe (a fresh-clone suite printed "warning: clean-up failed: [Errno 9] Bad file descriptor"
    after the interrupted line). Two threads at once, 30 times: no error (9 rounds of 40 failed without the
    lock)."""
    import multiprocessing
    import threading

    ctx = multiprocessing.get_context("fork")
    for _ in range(30):
        reader, writer = ctx.Pipe(duplex=False)
        stop, both, errors = ctx.RawValue("b", 0), threading.Barrier(2), []
        proc = ctx.Process(target=_until_stopped, args=(stop,), daemon=True)
        proc.start()
        writer.close()
        threads = [threading.Thread(target=_stop_at_once, args=(proc, reader, stop, both, errors)) for _ in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and not proc.is_alive(), errors


# A map-style Dataset that claims 10**12 samples; its first sample leaves a file named after the process.
HUGE = """
import os
import numpy as np

class Huge:
    def __init__(self, folder):
        self.folder = folder

    def __len__(self):
        return 10**12

    def __getitem__(self, i):
        open(os.path.join(self.folder, "taken"), "a").close()
        return np.zeros((8, 8, 3), np.uint8), 0

def make(folder):
    return Huge(folder)
"""


def test_epochs_of_a_dataset_claiming_a_trillion_samples_start_without_a_permutation_of_them(tmp_path, short_tmp):
    """An epoch's order is drawn as it goes where a permutation would not fit in memory (as the sweep does it):
    samples are taken, instead of an attempt at 7.28 TiB of indices; Ctrl-C then stops it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    p = loader_run(tmp_path, short_tmp, HUGE, "--epochs", "1", "--loader-arg", f"folder={marks}", "--batch", "4")
    wait_for(lambda: (marks / "taken").exists() or p.poll() is not None, "sample taken")
    assert p.poll() is None, p.communicate()[1][-2000:]
    os.killpg(p.pid, signal.SIGINT)
    assert p.wait(60) == 130
    assert left_in_session(p.pid) == []


def test_a_loader_producer_s_workers_stop_and_name_what_the_callable_left(tmp_path, ipc_dir):
    """The loader as producer processes: each worker stops what the callable started when it is done."""
    (tmp_path / "cache_loader.py").write_text(CACHE_SERVER)
    folder = tmp_path / "pids"
    folder.mkdir()
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=120) as c:
        p = start("-m", "producers", "loader", "--endpoint", endpoint, "--quiet", "--loader",
                  f"{tmp_path}/cache_loader.py:make", "--loader-arg", f"folder={folder}", "--batch", "4",
                  "--image-size", "8", "--count", "3")  # fmt: skip
        got = [c.recv() for _ in range(3)]
    code, _, err = finish(p, 120)
    assert code == 0, err[-3000:]
    assert [b.arrays[0].shape for b in got] == [(4, 8, 8, 3)] * 3
    notes = [ln for ln in err.splitlines() if "the loader's callable left processes running" in ln]
    assert len(notes) == 1 and "sleep 600" in notes[0], err[-3000:]
    started = [int(f.name.split("-")[1]) for f in folder.iterdir()]
    assert started and [pid for pid in started if running(pid)] == []
    assert left_in_session(p.pid) == []
