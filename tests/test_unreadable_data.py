"""A dataset folder with a file and a class folder that cannot be read: the decoders skip and count them.

Real processes: `python -m producers decode --cold-cache` into a real consumer, and `bench-decode --cold-cache`.
Root reads everything, so as root the commands run without the capabilities that let it (setpriv).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.zmq_pull import PullConsumer
from producers.commands import producer_command
from producers.dataset import make_dataset

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(180)


def as_a_user(cmd: list[str]) -> list[str]:
    """`cmd` as a process that file permissions apply to (root's override dropped)."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be applied")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]


@pytest.fixture
def data(tmp_path) -> Path:
    """Two readable classes of 4 JPEGs, one of them unreadable, and a third class folder that cannot be listed."""
    root = tmp_path / "data"
    make_dataset(root, classes=2, per_class=4, seed=3)
    locked = root / "n00000009"
    locked.mkdir()
    shutil.copy(root / "n00000000" / "n00000000_0.JPEG", locked / "x.JPEG")
    (root / "n00000000" / "n00000000_1.JPEG").chmod(0)
    locked.chmod(0)
    yield root
    locked.chmod(0o755)


def run(cmd: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(as_a_user(cmd), cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)  # fmt: skip


def test_the_decode_producer_skips_and_counts_what_it_cannot_read_with_a_cold_cache(data, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = run(producer_command("decode", endpoint, 4, 32, str(data), 1, count=2, extra=["--cold-cache"]))
        batches = [c.recv() for _ in range(2)]  # 8 images: every readable file, and past the unreadable one
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "Traceback" not in err
    assert "warning: skipping 1 unreadable class folder: n00000009" in err
    assert "warning: --cold-cache: 1 file that cannot be read" in err and "n00000000_1.JPEG" in err
    assert "decode: skipped 1 bad file (unreadable, or not decodable as JPEG)" in err
    assert all(b.arrays[0].std() > 5 for b in batches)


def test_bench_decode_skips_and_counts_what_it_cannot_read_with_a_cold_cache(data):
    p = run([
        sys.executable, "-m", "benchmarks", "bench-decode", "--data", str(data), "--cold-cache", "--image-size", "32",
        "--batch", "4", "--passes", "1", "--repeats", "1", "--warmup", "1", "--no-dali", "--no-wire",
        "--decoders", "pillow",
    ])  # fmt: skip
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "Traceback" not in err
    assert "warning: skipping 1 unreadable class folder: n00000009" in err
    assert "warning: --cold-cache: 1 file that cannot be read" in err
    assert "images/s per core" in out and "pillow" in out


def make_dataset_cli(folder: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "producers", "make-dataset", str(folder), "--classes", "1", "--per-class", "1", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_make_dataset_refuses_a_negative_seed_in_one_line(tmp_path):
    out = make_dataset_cli(tmp_path / "d", "--seed", "-1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1].endswith("argument --seed: -1 must be 0 or more")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_make_dataset_refuses_a_manifest_that_is_not_a_file_before_writing_anything(tmp_path, kind):
    """A pipe named MANIFEST.json would hang the write, a symlink would send it over its target: refused up front."""
    folder = tmp_path / "d"
    folder.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    if kind == "fifo":
        os.mkfifo(folder / "MANIFEST.json")
    else:
        (folder / "MANIFEST.json").symlink_to(target)
    out = make_dataset_cli(folder, "--like", "imagenet")
    assert out.returncode == 2, out.stderr
    what = "a pipe" if kind == "fifo" else "a symlink"
    assert out.stderr.splitlines() == [
        f"error: cannot make a dataset in {folder}: {folder}/MANIFEST.json is {what}, not a file: move it away "
        "(nothing written)"
    ]
    assert [f.name for f in folder.iterdir()] == ["MANIFEST.json"] and target.read_text() == "keep me"
