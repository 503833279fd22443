"""The processes around a user's loader: what its callable starts, what a killed process leaves, what a signal stops.

Real runs of `bench_input.py --loader-only` (the sweep, `--tune`, `--epochs`) on small loaders written here, with
real processes killed and interrupted; each test waits for the event it needs (a line printed, a file written, a
process gone), never a fixed time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

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
    code, out, err = finish(p, 120)
    assert code == 0, err[-3000:]
    assert not error_lines(err)
    notes = [ln for ln in err.splitlines() if "its callable started processes" in ln]
    assert len(notes) == 1, err[-3000:]
    assert "multiprocessing.Process 'cache-server'" in notes[0] and "sleep 600" in notes[0]
    started = [int(f.name.split("-")[1]) for f in folder.iterdir()]
    assert any(f.name.startswith("mp-") for f in folder.iterdir()), started
    assert [pid for pid in started if running(pid)] == []
    assert left_in_session(p.pid) == []
    assert os.listdir(folder)  # the servers did run


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


@pytest.mark.parametrize(
    "mode, line",
    [
        (["--epochs", "3"], "the epoch process died (exit code -9)"),
        (["--tune", "--target-rate", "1e9", "--loader-workers", "1", "--loader-seconds", "1"],
         "worker 0 died (exit code -9)"),
    ],
    ids=["epochs", "tune"],
)  # fmt: skip
def test_a_loader_process_killed_by_sigkill_is_one_line_and_its_dataloader_workers_go_first(tmp_path, mode, line):
    """SIGKILL of the process that iterates the loader while its DataLoader has workers: the run says so in its
    one line, and nothing else (the orphaned workers are stopped before the run removes its TMPDIR)."""
    (tmp_path / "slow_loader.py").write_text(SLOW_SAMPLES)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.Popen(
        [sys.executable, "bench_input.py", "--loader", f"{tmp_path}/slow_loader.py:make", "--loader-only",
         "--no-stages", *mode],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}, start_new_session=True,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    workers = wait_for(lambda: grandchildren(p.pid), "DataLoader worker")
    loader_process = workers[0].parent()
    loader_process.kill()
    p.wait(120)  # the run's exit: its orphaned DataLoader workers must be gone by then, not seconds later
    assert [w.pid for w in workers if running(w.pid)] == []
    code, _, err = finish(p, 120)
    assert code == 2
    assert err.splitlines() == [f"error: loader {tmp_path}/slow_loader.py:make: {line}"], err[-3000:]
    assert left_in_session(p.pid) == []
    assert list(tmp.iterdir()) == []  # TMPDIR/fb-* removed
