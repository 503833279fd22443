"""What an unfriendly user tries: loaders that reuse their buffers or never return, peers that stall shm://, signals.

Real processes throughout: `python -m producers loader` into a real
consumer, `bench_input.py` runs and `--loader-only` sweeps, real Unix sockets
held open by another process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from test_loader import error_lines, finish, start

from consumers.zmq_pull import PullConsumer

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(600)

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
"""


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


# --------------------------------------------------------------------------- 1: a loader that refills its buffer


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
