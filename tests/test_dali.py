"""The DALI producer as a real process against a real consumer (skipped where DALI is not installed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from test_decode import COLOURS, recv_exactly, write_colour_dataset

from consumers.zmq_pull import PullConsumer
from producers.commands import producer_command

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dali():
    return pytest.importorskip("nvidia.dali", reason="NVIDIA DALI not installed (pip install -e '.[dali]')")


@pytest.fixture(scope="module")
def colours(tmp_path_factory) -> Path:
    return write_colour_dataset(tmp_path_factory.mktemp("colours"))


def start_dali(procs, endpoint: str, data: Path, device: str = "cpu", count: int = 6, workers: int = 1):
    cmd = producer_command("dali", endpoint, 4, 64, str(data), workers, count=count, dali_device=device)
    return procs.start(*cmd[1:])


@pytest.mark.parametrize("workers", [1, 2])
def test_dali_cpu_delivers_batches_labelled_by_folder(dali, procs, ipc_dir, colours, workers):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=90) as c:
        p = start_dali(procs, endpoint, colours, count=6, workers=workers)
        batches = recv_exactly(c, 6)
    assert p.wait(30) == 0, p.stderr.read()
    seen = set()
    for b in batches:
        images, labels = b.arrays
        assert images.shape == (4, 64, 64, 3) and images.dtype == np.uint8
        assert labels.shape == (4,) and labels.dtype == np.int32
        for img, label in zip(images, labels, strict=True):
            # apple (red) = 0, grass (green) = 1, sky (blue) = 2: DALI agrees with the folder order
            assert int(img.reshape(-1, 3).mean(axis=0).argmax()) == label
            seen.add(int(label))
    assert seen == set(range(len(COLOURS)))
    assert {b.header.producer_id for b in batches} == set(range(workers))


def test_dali_gpu_delivers_batches(dali, procs, ipc_dir, colours):
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no GPU on this machine")
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=90) as c:
        p = start_dali(procs, endpoint, colours, device="gpu", count=3)
        batches = [b.arrays for b in recv_exactly(c, 3)]
    assert p.wait(30) == 0, p.stderr.read()
    for images, labels in batches:
        assert images.shape == (4, 64, 64, 3) and images.dtype == np.uint8
        assert set(labels.tolist()) <= {0, 1, 2}


def test_dali_missing_folder_is_one_line_exit_2(dali, procs, ipc_dir, tmp_path):
    p = start_dali(procs, f"ipc://{ipc_dir}/feed", tmp_path / "nothing")
    assert p.wait(30) == 2
    err = p.stderr.read().strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "nothing") in err


def test_without_dali_says_how_to_install(procs, ipc_dir, colours):
    # Hide nvidia.dali from the producer process, whether or not it is installed here.
    p = procs.start(
        "-c",
        "import sys; sys.modules['nvidia.dali'] = None; from producers.cli import main; sys.exit(main(sys.argv[1:]))",
        *producer_command("dali", f"ipc://{ipc_dir}/feed", 4, 64, str(colours))[3:],
    )
    assert p.wait(30) == 2
    err = p.stderr.read().strip()
    assert len(err.splitlines()) == 1 and "pip install -e '.[dali]'" in err, err
