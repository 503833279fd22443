"""The dataset maker and the Python decode producer, as real processes against a real consumer."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from producers.commands import producer_command
from producers.dataset import make_dataset

pytestmark = pytest.mark.timeout(120)

# Class folders in sorted order, each of one solid colour: a label can be checked against the pixels.
COLOURS = {"apple": (210, 40, 30), "grass": (40, 190, 50), "sky": (30, 60, 220)}


def write_colour_dataset(root: Path, per_class: int = 4) -> Path:
    for c, rgb in COLOURS.items():
        (root / c).mkdir(parents=True)
        for k in range(per_class):
            size = (120 + 10 * k, 90) if k % 2 else (90, 120 + 10 * k)
            Image.new("RGB", size, rgb).save(root / c / f"{c}_{k}.JPEG", quality=90)
    return root


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """3 classes x 4 photographs from the dataset maker."""
    root = tmp_path_factory.mktemp("photos")
    make_dataset(root, classes=3, per_class=4, seed=1)
    return root


@pytest.fixture(scope="module")
def colours(tmp_path_factory) -> Path:
    return write_colour_dataset(tmp_path_factory.mktemp("colours"))


def with_bad_files(root: Path, good_from: Path) -> Path:
    """One class: three good JPEGs, a truncated JPEG and a text file named x.jpg."""
    cls = root / "only"
    cls.mkdir(parents=True)
    for src in sorted((good_from / "apple").iterdir())[:3]:
        shutil.copy(src, cls / src.name)
    data = (cls / src.name).read_bytes()
    (cls / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (cls / "x.jpg").write_text("this is not a picture\n")
    return root


def recv_exactly(c: PullConsumer, n: int) -> list:
    """n batches, then check nothing more comes (which also gives the producer time to see us leave)."""
    batches = [c.recv() for _ in range(n)]
    c.recv_timeout = 0.5
    with pytest.raises(ReceiveTimeout):
        c.recv()
    return batches


def start_decode(procs, endpoint: str, data: Path, *extra: str, batch: int = 4, workers: int = 1, count: int = 8):
    cmd = producer_command("decode", endpoint, batch, 64, str(data), workers, count=count, extra=extra)
    return procs.start(*cmd[1:])


def test_make_dataset_writes_jpegs_of_imagenet_sizes(procs, tmp_path):
    p = procs.start("-m", "producers", "make-dataset", str(tmp_path / "ds"), "--classes", "2", "--per-class", "5")
    assert p.wait(60) == 0, p.stderr.read()
    folders = sorted((tmp_path / "ds").iterdir())
    assert [f.name for f in folders] == ["n00000000", "n00000001"]
    blobs = set()
    for folder in folders:
        files = sorted(folder.iterdir())
        assert len(files) == 5
        for f in files:
            with Image.open(f) as im:
                im.load()
                assert im.format == "JPEG" and im.mode == "RGB"
                long_side, short_side = max(im.size), min(im.size)
                assert 460 <= long_side <= 660 and 300 <= short_side <= 520, im.size
            blobs.add(f.read_bytes())
    assert len(blobs) == 10, "every file is a different picture"


def test_made_photographs_are_not_noise(photos):
    # Neighbouring pixels of a photograph are alike; in random noise they are not.
    img = np.asarray(Image.open(next((photos / "n00000000").iterdir())).convert("L"), dtype=np.float64)
    assert np.abs(np.diff(img, axis=1)).mean() < 20


def test_decode_producer_delivers_full_batches(procs, ipc_dir, photos):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = start_decode(procs, endpoint, photos, workers=2, count=8)
        batches = recv_exactly(c, 8)
    assert p.wait(30) == 0, p.stderr.read()
    labels = set()
    for b in batches:
        images, lab = b.arrays
        assert images.shape == (4, 64, 64, 3) and images.dtype == np.uint8
        assert lab.shape == (4,) and lab.dtype == np.int32
        assert images.std() > 5, "decoded photographs, not blank images"
        labels.update(lab.tolist())
    assert labels == {0, 1, 2}  # 32 images from 12 files: every class is seen
    assert {b.header.producer_id for b in batches} == {0, 1}
    assert all(b.header.extras["bad_files"] == 0 for b in batches)


def test_labels_follow_sorted_class_folders(procs, ipc_dir, colours):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        start_decode(procs, endpoint, colours, count=6)
        batches = [c.recv().arrays for _ in range(6)]
    seen = set()
    for images, labels in batches:
        for img, label in zip(images, labels, strict=True):
            # apple (red) = 0, grass (green) = 1, sky (blue) = 2
            assert int(img.reshape(-1, 3).mean(axis=0).argmax()) == label
            seen.add(int(label))
    assert seen == {0, 1, 2}


def test_bad_files_are_skipped_and_counted(procs, ipc_dir, tmp_path, colours):
    data = with_bad_files(tmp_path / "ds", colours)
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        p = start_decode(procs, endpoint, data, batch=2, count=6)
        batches = recv_exactly(c, 6)
    assert p.wait(30) == 0
    err = p.stderr.read()
    for b in batches:
        images, labels = b.arrays
        assert images.shape == (2, 64, 64, 3), "skipped files are replaced, batches stay full"
        assert labels.tolist() == [0, 0]
        assert int(images.reshape(-1, 3).mean(axis=0).argmax()) == 0  # only the red pictures
    assert batches[-1].header.extras["bad_files"] == 2  # counted once, though seen in several epochs
    assert "truncated.jpg" in err and "x.jpg" in err
    assert "skipped 2 bad files" in err


def test_bad_file_fails_when_asked_naming_it(procs, ipc_dir, tmp_path, colours):
    data = with_bad_files(tmp_path / "ds", colours)
    (data / "only" / "truncated.jpg").unlink()
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60):
        # A batch of 4 from 4 files needs x.jpg before anything can be sent.
        p = start_decode(procs, endpoint, data, "--on-bad-file", "fail", batch=4, count=2)
        assert p.wait(60) != 0
    err = p.stderr.read()
    assert str(data / "only" / "x.jpg") in err
    assert "Traceback" not in err


def test_only_bad_files_is_an_error_not_a_hang(procs, ipc_dir, tmp_path):
    (tmp_path / "ds" / "c").mkdir(parents=True)
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / "ds" / "c" / name).write_text("no picture here")
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60):
        p = start_decode(procs, endpoint, tmp_path / "ds", count=2)
        assert p.wait(60) != 0
    assert "nothing to send" in p.stderr.read()


@pytest.mark.parametrize("layout", ["missing", "empty", "no class folders", "no jpegs"])
def test_unusable_folder_is_one_line_exit_2(procs, ipc_dir, tmp_path, layout):
    data = tmp_path / "data"
    if layout != "missing":
        data.mkdir()
    if layout == "no class folders":
        (data / "a.jpg").write_bytes(b"")
    if layout == "no jpegs":
        (data / "cls").mkdir()
        (data / "cls" / "notes.txt").write_text("hi")
    p = start_decode(procs, f"ipc://{ipc_dir}/feed", data)
    assert p.wait(30) == 2
    err = p.stderr.read().strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and str(data) in err, err


def test_file_list_selects_files_and_labels(procs, ipc_dir, tmp_path, colours):
    listing = tmp_path / "list.txt"
    listing.write_text("sky/sky_0.JPEG\nsky/sky_1.JPEG 7\n")  # folder label 2, explicit label 7
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        start_decode(procs, endpoint, colours, "--list", str(listing), count=4)
        labels = np.concatenate([c.recv().arrays[1] for _ in range(4)])
    assert set(labels.tolist()) == {2, 7}


def test_bench_decode_prints_a_table(procs, photos):
    p = procs.start(
        "-m", "benchmarks", "bench-decode", "--data", str(photos), "--image-size", "64", "--batch", "4",
        "--passes", "3", "--repeats", "1", "--warmup", "1", "--no-dali", "--decoders", "simplejpeg", "pillow",
    )  # fmt: skip
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "images/s per core" in out and "simplejpeg" in out and "pillow" in out
    # Without --batches a window spans whole passes over a small set: 12 files, 3 passes, 4 per batch -> at
    # least 9 batches (10, the least a window gets).
    assert "windows of 10 batches (3.3 passes over the set)" in out, out


def test_producer_command_spells_the_flags():
    cmd = producer_command("decode", "ipc:///tmp/x", 32, 128, "/data", workers=3, count=5)
    assert cmd[1:4] == ["-m", "producers", "decode"]
    assert cmd[cmd.index("--data") + 1] == "/data" and cmd[cmd.index("--workers") + 1] == "3"
    assert "--data" not in producer_command("synthetic", "ipc:///tmp/x", 32, 128)
    assert producer_command("dali", "ipc:///tmp/x", 8, 64, "/d")[-3:-1] == ["--dali-device", "cpu"]
    with pytest.raises(ValueError, match="data folder"):
        producer_command("dali", "ipc:///tmp/x", 8, 64)
    with pytest.raises(ValueError, match="unknown producer kind"):
        producer_command("magic", "ipc:///tmp/x", 8, 64)
