"""Loaders a user hands over that misbehave: buffers refilled in place, calls that never return, bad or huge or
empty samples, modules that exit on import or shadow the project's, workers that die or are stopped.

Real processes throughout: `python -m producers loader` into a real consumer, `bench_input.py` runs of both trainers
and `--loader-only` sweeps; each case ends with every batch as made, or one line naming the loader, and nothing left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pytest
from test_loader import data as photos  # noqa: F401  (a fixture: a small JPEG folder)
from test_loader import error_lines, finish, left_in_session, start

from consumers.zmq_pull import PullConsumer

pytestmark = pytest.mark.timeout(600)


ROOT = Path(__file__).resolve().parent.parent


HOSTILE = """
import time
import numpy as np

def refill(batch_size=4, image_size=8):
    # One preallocated buffer, refilled and yielded for every batch (a common reader pattern).
    images = np.zeros((batch_size, image_size, image_size, 3), np.uint8)
    labels = np.zeros(batch_size, np.int64)
    i = 0
    while True:
        images.setflags(write=True)
        images[:] = i % 251
        labels[:] = np.arange(batch_size) + i * batch_size
        images.setflags(write=False)
        i += 1
        yield images, labels

def never_returns(**kwargs):
    time.sleep(3600)

def good():
    while True:
        yield np.ones((2, 8, 8, 3), np.uint8), np.arange(2)

class Samples:
    # A map-style dataset whose transform is timed stage by stage; `hang_at` / `raise_at`: a sample that never
    # returns or raises once the stage timer has wrapped the transform (so the sweep itself runs).
    def __init__(self, n=10**12, hang_at=None, raise_at=None):
        self.n, self.hang_at, self.raise_at, self.taken = n, hang_at, raise_at, 0
        self.transform = [self.plain]

    @staticmethod
    def plain(x):
        return x

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.taken += self.transform[0] is not self.plain
        if self.taken == self.hang_at:
            time.sleep(3600)
        if self.taken == self.raise_at:
            raise ValueError(f"corrupt sample {i}")
        return self.transform[0](np.full((8, 8, 3), i % 251, np.uint8)), i % 10

def huge():
    return Samples()

def empty():
    return Samples(n=0)

def sample_hangs():
    return Samples(hang_at=8)

def sample_raises():
    return Samples(raise_at=8)

def hungry():
    # Burns 20 ms of CPU for every batch, on the thread that iterates it.
    while True:
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass
        yield np.ones((2, 8, 8, 3), np.uint8), np.arange(2)

def empty_batches():
    while True:
        yield np.zeros((0, 8, 8, 3), np.uint8), np.zeros(0, np.int64)
"""


ODD = """
import torch
import tensorflow as tf
from torch.utils.data import DataLoader, Dataset

class B(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.zeros(8, 8, 3, dtype=torch.bfloat16), i

def bf16():
    return DataLoader(B(), batch_size=2)

def finite(batch_size=2, image_size=8):
    x = tf.zeros((8, image_size, image_size, 3), tf.uint8)
    return tf.data.Dataset.from_tensor_slices((x, tf.range(8))).batch(batch_size, drop_remainder=True)
"""


BAD_IMPORTS = {
    "exits.py": "import sys\nsys.exit(0)\n",
    "raises.py": "raise RuntimeError('no such data folder')\n",
    "deep.py": "def make(x=None):\n    return x\n",
}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hostile") / "hostile_loaders.py"
    path.write_text(HOSTILE)
    return str(path)


def assert_whole(batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Every batch of the refilling loader arrived once, its images the ones made with its labels."""
    firsts = [int(labels[0]) for _, labels in batches]
    assert len(set(firsts)) == len(firsts), f"labels repeated: {len(firsts) - len(set(firsts))} of {len(firsts)}"
    for images, labels in batches:
        assert (labels == np.arange(len(labels)) + labels[0]).all()
        assert (images == (int(labels[0]) // len(labels)) % 251).all(), "another batch's images"


@pytest.mark.parametrize("transport", ["ipc", "shm"])
def test_a_loader_refilling_one_buffer_delivers_every_batch_as_made(hostile, ipc_dir, transport):
    """The producer keeps up to --hwm batches queued: each must be the loader's batch as it was when yielded."""
    endpoint = f"ipc://{ipc_dir}/feed" if transport == "ipc" else f"shm://fb-hostile-{os.getpid()}"
    n = 200
    with PullConsumer(endpoint, recv_timeout=120) as c:
        p = start("-m", "producers", "loader", "--endpoint", endpoint, "--quiet", "--loader", f"{hostile}:refill",
                  "--batch", "4", "--image-size", "8", "--count", str(n), "--hwm", "8")  # fmt: skip
        got = []
        for _ in range(n):
            b = c.recv()
            got.append((b.arrays[0].copy(), b.arrays[1].copy()))
            time.sleep(0.002)  # a consumer a little slower than the loader: the producer's queue fills
    code, _, err = finish(p, 120)
    assert code == 0, err
    assert_whole(got)


def test_reuse_of_unchanged_slots_is_refused_for_a_loader(hostile):
    p = start("-m", "producers", "loader", "--endpoint", "shm://fb-hostile-reuse", "--quiet",
              "--loader", f"{hostile}:refill", "--reuse-unchanged-slots", "--count", "3")  # fmt: skip
    code, _, err = finish(p, 60)
    assert code == 2, err
    [line] = error_lines(err)
    assert "--reuse-unchanged-slots" in line and "loader" in line


@pytest.mark.parametrize("how", ["Ctrl-C to the group", "SIGTERM to the producer", "SIGKILL to the producer"])
def test_a_standalone_loader_producer_stopped_leaves_none_of_its_loaders_processes(photos, ipc_dir, how):  # noqa: F811
    """A DataLoader with worker processes (and torch's resource tracker) inside a standalone producer's worker:
    however the producer is stopped, none of them stays behind, and no shared memory."""
    endpoint = f"shm://fb-hostile-stop-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": ipc_dir}
    p = subprocess.Popen(
        [sys.executable, "-m", "producers", "loader", "--endpoint", endpoint, "--quiet",
         "--loader", "examples/torchvision_imagefolder.py:make_loader", "--loader-arg", f"data={photos}",
         "--loader-arg", "num_workers=2", "--batch", "4", "--image-size", "32"],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    with PullConsumer(endpoint, recv_timeout=120) as c:
        for _ in range(4):  # batches made by the DataLoader's workers: every process is running
            c.recv()
        assert len(psutil.Process(p.pid).children(recursive=True)) >= 3  # the worker and its 2 loader workers
        if how == "Ctrl-C to the group":
            os.killpg(p.pid, signal.SIGINT)
        else:
            p.send_signal(signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGKILL)
        code, _, err = finish(p, 120)
    # A producer the user stops ends as it should (0); a killed one says nothing, its workers die with it.
    assert code == (-signal.SIGKILL if how.startswith("SIGKILL") else 0) and "Traceback" not in err, err[-2000:]
    assert left_in_session(p.pid) == []
    assert not [f for f in os.listdir("/dev/shm") if "fb-hostile-stop" in f]


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_a_loader_that_never_returns_inside_the_trainer_ends_in_one_line(hostile, framework):
    p = start("bench_input.py", "--framework", framework, "--fake-location", "loader", "--loader",
              f"{hostile}:never_returns", "--loader-timeout", "3", "--emulate-rate", "100", "--num-gpus", "1",
              "--batch", "2", "--image-size", "8", "--warmup-steps", "1", "--steps", "2", "--repeats", "1")  # fmt: skip
    code, _, err = finish(p, 240)
    assert code == 2, err[-2000:]
    [line] = error_lines(err)
    assert f"loader {hostile}:never_returns" in line and "has not returned after 3 s" in line, line
    assert "Traceback" not in err and "has no attribute" not in err
    assert left_in_session(p.pid) == []


@pytest.mark.parametrize(
    ("name", "words"),
    [("sample_hangs", "no sample for 3 s after sample"), ("sample_raises", "raised ValueError: corrupt sample")],
)
def test_loader_only_stage_timing_of_a_bad_sample_keeps_the_sweep(hostile, tmp_path, name, words):
    """The sweep's figures are written; the stage table says why it stopped, in one line."""
    js = tmp_path / "loader.json"
    p = start("bench_input.py", "--loader", f"{hostile}:{name}", "--loader-only", "--loader-workers", "1",
              "--loader-seconds", "1", "--loader-timeout", "3", "--batch", "4", "--json", str(js))  # fmt: skip
    code, out, err = finish(p, 120)
    assert code == 0, err[-2000:]
    assert "Traceback" not in err
    doc = json.loads(js.read_text())
    assert doc["points"][0]["images_per_sec"] > 0 if "points" in doc else doc
    assert words in out and f"loader {hostile}:{name}" in out, out
    assert left_in_session(p.pid) == []


def test_a_huge_dataset_is_sampled_without_a_permutation_and_an_empty_one_is_named(hostile):
    p = start("bench_input.py", "--loader", f"{hostile}:huge", "--loader-only", "--loader-workers", "1",
              "--loader-seconds", "1", "--loader-timeout", "20", "--batch", "4")  # fmt: skip
    code, out, err = finish(p, 120)
    assert code == 0, err[-2000:]
    assert "stages:" not in out or "stopped" not in out, out
    p = start("bench_input.py", "--loader", f"{hostile}:empty", "--loader-only", "--loader-workers", "1",
              "--loader-seconds", "1", "--loader-timeout", "20", "--no-stages")  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 2, err[-2000:]
    [line] = error_lines(err)
    assert f"loader {hostile}:empty" in line and "dataset is empty (len 0)" in line, line


@pytest.mark.parametrize("name", sorted(BAD_IMPORTS))
def test_a_loader_module_that_exits_or_raises_on_import_is_one_line(tmp_path, name):
    path = tmp_path / name
    path.write_text(BAD_IMPORTS[name])
    code, _, err = finish(start("bench_input.py", "--loader", f"{path}:make", "--loader-only", "--no-stages"), 60)
    lines = error_lines(err)
    if name == "deep.py":  # imports fine; what it returns is refused
        assert code == 2 and len(lines) == 1 and "returned NoneType" in lines[0], err
        return
    assert code == 2, err
    assert len(lines) == 1 and f"importing {path} raised" in lines[0], err
    assert ("SystemExit" if name == "exits.py" else "RuntimeError: no such data folder") in lines[0]


@pytest.mark.parametrize(
    ("suffix", "imports"), [("", "numpy"), (".txt", "numpy"), (".loader.py", "numpy"), (".py", "cv2")]
)
def test_a_loader_file_of_any_suffix_is_imported_once(tmp_path, suffix, imports):
    """Once per process that imports it. A worker is a copy of the sweep's process, which imported the file
    already (OpenCV's import included: its pool starts only once used), unless the process started something
    a copy cannot carry (the next test); then the worker is spawned and imports the file itself."""
    path = tmp_path / f"myloader{suffix}"
    path.write_text(
        f"import os, numpy as np, {imports}\n"
        "with open(os.environ['FB_IMPORTS'], 'a') as f:\n    f.write(f'{os.getpid()}\\n')\n"
        "def make():\n    while True:\n        yield np.ones((2, 8, 8, 3), np.uint8), np.arange(2)\n"
    )
    counter = tmp_path / "imports"
    counter.write_text("")
    env = {**os.environ, "FB_IMPORTS": str(counter)}
    p = subprocess.Popen(
        [sys.executable, "bench_input.py", "--loader", f"{path}:make", "--loader-only", "--loader-workers", "1",
         "--loader-seconds", "1"], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 0, err[-2000:]
    per_process = Counter(counter.read_text().split())
    assert set(per_process.values()) == {1}, f"imported more than once in a process: {per_process}"
    # The sweep's process (checks, stage timing) only: its worker is a copy of it.
    assert len(per_process) == 1, per_process


def test_a_process_that_started_a_pool_after_the_loaders_import_spawns_its_workers():
    """The rule of core/loader_start.py in a fresh process: copies while OpenCV and TensorFlow are only
    imported, spawned once OpenCV's pool runs or TensorFlow's runtime is up."""
    script = (
        "import numpy as np, cv2, tensorflow as tf\n"
        "from core import loader_start as s\n"
        "print(s.start_method())\n"  # no loader's import counted yet
        "s.note_imported()\n"
        "print(s.start_method())\n"
        "img = np.zeros((2000, 2000, 3), np.uint8)\n"
        "for _ in range(5):\n    cv2.GaussianBlur(img, (15, 15), 0)\n"
        "print(s.start_method(), s.library_threads() > s._imported_threads, cv2.getNumThreads())\n"
        "s._imported_threads = s.library_threads()\n"  # as if the pool were the file's: TensorFlow's op still counts
        "tf.constant(1)\n"
        "print(s.start_method())\n"
    )
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.split("\n")
    # OpenCV starts a pool only where it may use more than one core (its size follows the CPU affinity: none
    # under `taskset -c 0`); the process's own count of OpenCV's threads says which.
    pool_started = int(lines[2].split()[-1]) > 1
    assert lines[:4] == [
        "spawn",
        "fork",
        f"{'spawn' if pool_started else 'fork'} {pool_started} {lines[2].split()[-1]}",
        "spawn",
    ]


def test_a_loader_folder_with_modules_named_like_the_projects_does_not_shadow_them(tmp_path, ipc_dir):
    """`python -m producers` started in the loader's own folder, which holds core.py, wire.py and producers/."""
    for name in ("core.py", "wire.py"):
        (tmp_path / name).write_text("raise SystemExit('the loader folder shadowed the project')\n")
    (tmp_path / "myloader.py").write_text(HOSTILE)
    endpoint = f"ipc://{ipc_dir}/feed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = subprocess.Popen(
            [sys.executable, "-m", "producers", "loader", "--loader", "myloader.py:good", "--endpoint", endpoint,
             "--count", "3", "--quiet"], cwd=tmp_path, env=env, text=True, stderr=subprocess.PIPE,
        )  # fmt: skip
        got = [c.recv() for _ in range(3)]
    code, _, err = finish(p, 60)
    assert code == 0 and "shadowed" not in err, err
    assert [b.arrays[0].shape for b in got] == [(2, 8, 8, 3)] * 3


def test_a_relative_loader_path_is_found_by_the_ranks_and_the_producer_kind_is_not_overridden(tmp_path):
    """Ranks start in the project's folder: a loader path relative to the user's folder still names the same file."""
    (tmp_path / "myloader.py").write_text(HOSTILE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, str(ROOT / "bench_input.py"), "--loader", "myloader.py:good", "--emulate-rate", "100",
           "--num-gpus", "1", "--batch", "2", "--image-size", "8", "--warmup-steps", "1", "--steps", "2",
           "--repeats", "1"]  # fmt: skip
    p = subprocess.Popen([*run, "--framework", "torch", "--fake-location", "loader"], cwd=tmp_path, env=env,
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    code, _, err = finish(p, 240)
    assert code == 0, err[-2000:]
    p = subprocess.Popen([*run, "--fake-location", "zmq-consume", "--producer-kind", "decode", "--data", "/nonexistent"],
                         cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 2, err[-2000:]
    assert error_lines(err) == [
        "error: --loader and --producer-kind decode: the loader is the run's producers; drop one"
    ]


def _wait_for_processes(pid: int, n: int, limit_s: float = 120) -> None:
    """Until process `pid` has at least `n` descendants (the sweep's workers and their DataLoader workers)."""
    import psutil

    end = time.monotonic() + limit_s
    proc = psutil.Process(pid)
    while len(proc.children(recursive=True)) < n:
        assert time.monotonic() < end, "the sweep's workers never started"
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_once_loader_only_workers_run_ends_in_one_line_with_nothing_left(photos, ipc_dir, sig):  # noqa: F811
    tmpdir = ipc_dir  # short: multiprocessing puts sockets in TMPDIR, and their paths are limited
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir)}
    p = subprocess.Popen(
        [sys.executable, "bench_input.py", "--loader", "examples/torchvision_imagefolder.py:make_loader",
         "--loader-arg", f"data={photos}", "--loader-arg", "num_workers=1", "--loader-only", "--loader-workers", "1",
         "--loader-seconds", "60", "--loader-arg", "batch_size=4", "--loader-arg", "image_size=32"],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    _wait_for_processes(p.pid, 3)  # resource tracker or not: the worker and its DataLoader worker at least
    time.sleep(1)  # into the measured window
    p.send_signal(sig)
    code, _, err = finish(p, 60)
    assert code == 128 + sig, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"interrupted ({signal.Signals(sig).name}): stopping producers; no results written"
    ] or "interrupted" in err, err
    assert left_in_session(p.pid) == []
    # torch keeps its compile cache (torchinductor_<user>) in TMPDIR by design; nothing else may stay
    assert [f for f in os.listdir(tmpdir) if not f.startswith("torchinductor_")] == [], "left in TMPDIR"


DIES = """
import os
import torch
from torch.utils.data import DataLoader, Dataset

class D(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 5:
            os._exit(1)  # the DataLoader worker dies
        return torch.zeros(8, 8, 3, dtype=torch.uint8), i

def make():
    return DataLoader(D(), batch_size=4, num_workers=1)
"""


def test_a_dataloader_worker_that_dies_under_loader_only_leaves_nothing_in_tmpdir(tmp_path, ipc_dir):
    (tmp_path / "dies.py").write_text(DIES)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": ipc_dir}
    p = subprocess.Popen(
        [sys.executable, "bench_input.py", "--loader", f"{tmp_path}/dies.py:make", "--loader-only",
         "--loader-workers", "1", "--loader-seconds", "1", "--no-stages"],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 2, err[-2000:]
    [line] = error_lines(err)
    assert "DataLoader worker" in line and "exited unexpectedly" in line, line
    assert left_in_session(p.pid) == []
    assert [f for f in os.listdir(ipc_dir) if not f.startswith("torchinductor_")] == [], "left in TMPDIR"


def test_empty_batches_are_named_as_such(hostile):
    p = start("bench_input.py", "--loader", f"{hostile}:empty_batches", "--loader-only", "--loader-workers", "1",
              "--loader-timeout", "3", "--no-stages")  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 2, err[-2000:]
    [line] = error_lines(err)
    assert f"loader {hostile}:empty_batches: batch 1:" in line and "a batch of no images" in line, line
    assert "--batch 0" not in line


@pytest.mark.parametrize(("framework", "name"), [("torch", "bf16"), ("tf", "finite")])
def test_a_rank_names_the_loader_of_bf16_tensors_and_a_finite_tf_data_is_passed_over_again(tmp_path, framework, name):
    (tmp_path / "odd.py").write_text(ODD)
    p = start("bench_input.py", "--framework", framework, "--fake-location", "loader", "--loader",
              f"{tmp_path}/odd.py:{name}", "--emulate-rate", "100", "--num-gpus", "1", "--batch", "2", "--image-size",
              "8", "--warmup-steps", "2", "--steps", "10", "--repeats", "1")  # fmt: skip
    code, _, err = finish(p, 240)
    if name == "finite":  # 4 batches a pass, 12 steps: passed over again, as the other loaders are
        assert code == 0, err[-2000:]
    else:
        assert code == 2, err[-2000:]
        [line] = error_lines(err)
        assert f"loader {tmp_path}/odd.py:bf16: batch 1: images torch.bfloat16" in line, line
    assert left_in_session(p.pid) == []


@pytest.mark.timing
def test_a_cpu_hungry_loader_inside_tensorflow_is_counted_as_input_cpu(hostile, tmp_path):
    js = tmp_path / "run.json"
    p = start("bench_input.py", "--fake-location", "loader", "--loader", f"{hostile}:hungry", "--emulate-rate", "100",
              "--num-gpus", "1", "--batch", "2", "--image-size", "8", "--warmup-steps", "2", "--steps", "30",
              "--repeats", "1", "--json", str(js))  # fmt: skip
    code, _, err = finish(p, 300)
    assert code == 0, err[-2000:]
    cpu = json.loads(js.read_text())["paths"]["loader"]["attribution"]["cpu"]
    assert cpu["input_cores"] > 0.1, cpu  # the loader's thread: not the trainer's step


ONE_BATCH = """
import numpy as np


def fn(batch_size=2, image_size=8):
    yield np.zeros((batch_size, image_size, image_size, 3), np.uint8), np.zeros((batch_size,), np.int32)
"""


@pytest.mark.parametrize(("framework", "path"), [("tf", "python-queue"), ("torch", "zmq-consume")])
def test_a_generator_that_ends_after_one_batch_is_called_again_by_its_producers(tmp_path, framework, path):
    """A generator loader is one pass; its producers call it again per pass, so 7 steps of a 1-batch generator run."""
    (tmp_path / "one.py").write_text(ONE_BATCH)
    p = start("bench_input.py", "--framework", framework, "--fake-location", path, "--loader", f"{tmp_path}/one.py:fn",
              "--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "8", "--warmup-steps", "2",
              "--steps", "5", "--repeats", "1", "--recv-timeout", "20", "--json", str(tmp_path / "r.json"))  # fmt: skip
    code, _, err = finish(p, 240)
    assert code == 0, err[-2000:]
    assert path in json.loads((tmp_path / "r.json").read_text())["paths"]
    assert left_in_session(p.pid) == []
