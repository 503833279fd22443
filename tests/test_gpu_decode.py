"""gpu-decode: read producers send JPEG files undecoded (ipc, tcp, shm://); each rank decodes on its device.

Without a GPU the rank decodes on the host and says so (`decoded_on: cpu`). Real producer processes, real
sockets, a small ImageNet-like folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from consumers.zmq_pull import PullConsumer
from core.images.files import list_images
from tests.conftest import ROOT, ShmLeaks
from tests.schema import check_report
from wire import strings
from wire.endpoints import free_tcp_port


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """16 small JPEGs in 2 classes."""
    d = tmp_path_factory.mktemp("jpegs")
    subprocess.run(
        [sys.executable, "-m", "producers", "make-dataset", str(d), "--classes", "2", "--per-class", "8"],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return d


@pytest.mark.parametrize("transport", ["ipc", "tcp", "shm"])
def test_read_producers_send_each_file_once_per_pass_as_it_is(transport, folder, procs, ipc_dir) -> None:
    endpoint = {
        "ipc": f"ipc://{ipc_dir}/read",
        "tcp": f"tcp://127.0.0.1:{free_tcp_port()}",
        "shm": f"shm://t-read-{Path(ipc_dir).name}",
    }[transport]
    leaks = ShmLeaks(endpoint.removeprefix("shm://")) if transport == "shm" else None
    files, labels, _ = list_images(folder)
    with PullConsumer(endpoint, True, 4, 30.0) as consumer:
        for pid, shard in enumerate(("0/2", "1/2")):  # two producers, ids of their own, share one pass
            procs.start("-m", "producers", "read", "--endpoint", endpoint, "--data", str(folder), "--batch", "4",
                        "--shard", shard, "--count", "2", "--producer-id", str(pid), "--quiet")  # fmt: skip
        seen = []
        for _ in range(4):
            batch = consumer.recv()
            items, got_labels, indices = batch.arrays
            assert strings.is_strings(items) and len(items) == 4
            for b, label, i in zip(items, got_labels, indices, strict=True):
                assert b == (folder / files[i]).read_bytes()  # the file itself, not a decoded image
                assert label == labels[i]
            seen += indices.tolist()
        assert sorted(seen) == list(range(len(files)))  # every file once
        table = consumer.tracker.table()
        assert all(row["lost"] == 0 and row["duplicated"] == 0 for row in table), table
    for p in procs.started:
        assert p.wait(timeout=30) == 0, p.stderr.read()
    if leaks is not None:
        leaks.assert_none_left()


def run_bench(procs, out: Path, data: Path, *extra: str) -> tuple[int, str]:
    """A short gpu-decode run (2 ranks, 2 producers unless `extra` says otherwise): its exit code and output."""
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", "gpu-decode", "--data", str(data),
        "--batch", "4", "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2",
        "--producers", "2", "--json", str(out), *extra,
    )  # fmt: skip
    out, err = run.communicate(timeout=300)
    return run.returncode, out + err


def copy_with_one_damaged(folder: Path, to: Path, body) -> Path:
    """A copy of `folder` whose 6th file is `body(its bytes)`; returns that file."""
    for f in folder.rglob("*.JPEG"):
        (to / f.parent.name).mkdir(parents=True, exist_ok=True)
        (to / f.parent.name / f.name).write_bytes(f.read_bytes())
    bad = sorted(to.rglob("*.JPEG"))[5]
    bad.write_bytes(body(bad.read_bytes()))
    return bad


@pytest.mark.timeout(400)
def test_gpu_decode_feeds_two_ranks_every_file_once_per_pass_skipping_one_not_a_jpeg(folder, procs, tmp_path) -> None:
    """16 files, a PNG named .JPEG among them (as in ImageNet): named once, and no pass brings it."""
    bad = copy_with_one_damaged(folder, tmp_path / "data", lambda b: b"\x89PNG\r\n\x1a\n, named .JPEG")
    code, out = run_bench(procs, tmp_path / "r.json", tmp_path / "data", "--input-only")
    assert code == 0, out[-3000:]
    assert len([ln for ln in out.splitlines() if str(bad) in ln and "not a JPEG" in ln]) == 1, out[-3000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    check_report(doc)
    r = doc["paths"]["gpu-decode"]
    assert [d["on"] for d in r["decoded_on"]] == ["cpu", "cpu"]
    assert r["batches_trained"] == 2 * (1 + 3 * 2)
    files = r["files"]  # each rank: its producer's half of the folder, every file but the PNG once per pass
    assert [f["mine"] for f in files] == [8, 8] and sum(f["skipped"] for f in files) == 1
    for f in files:
        assert f["distinct"] == f["mine"] - f["skipped"] and f["once_per_pass"]
        assert f["delivered"] == 4 * (1 + 3 * 2)
    assert all(p["lost"] == 0 and p["duplicated"] == 0 for p in r["producers"])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("model", [(), ("--model", "emulated", "--emulate-rate", "2000")], ids=["resnet50", "emulated"])
def test_one_rank_trains_from_gpu_decode(model, folder, procs, tmp_path) -> None:
    one = ("--num-gpus", "1", "--producers", "1", "--steps", "2")  # ResNet-50 on the host: few steps
    code, err = run_bench(procs, tmp_path / "r.json", folder, *one, *model)
    assert code == 0, err[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())["paths"]["gpu-decode"]
    assert r["decoded_on"] == [{"rank": 0, "on": "cpu"}]
    assert r["files"][0]["mine"] == 16 and r["files"][0]["once_per_pass"]


@pytest.mark.timeout(400)
def test_a_truncated_file_stops_the_run_naming_it(folder, procs, tmp_path) -> None:
    bad = copy_with_one_damaged(folder, tmp_path / "data", lambda b: b[: len(b) // 3])
    leaks = ShmLeaks()
    code, err = run_bench(procs, tmp_path / "r.json", tmp_path / "data", "--input-only", "--transport", "shm")
    assert code != 0
    named = [ln for ln in err.splitlines() if str(bad) in ln]
    assert len(named) == 1 and "cannot decode" in named[0] and "truncated" in named[0], err[-3000:]
    assert "Traceback" not in err
    assert not (tmp_path / "r.json").exists()
    leaks.assert_none_left()


@pytest.mark.timeout(400)
def test_real_data_compares_every_way_to_feed_from_one_folder(folder, procs, tmp_path) -> None:
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--real-data", "--data", str(folder), "--input-only",
        "--num-gpus", "1", "--batch", "4", "--image-size", "32", "--warmup-steps", "1", "--steps", "3",
        "--repeats", "2", "--json", str(tmp_path / "r.json"),
    )  # fmt: skip
    out, err = run.communicate(timeout=360)
    assert run.returncode == 0, err[-3000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    check_report(doc)
    paths = doc["paths"]
    assert {"gpu", "zmq-consume", "loader", "gpu-decode"} <= set(paths)
    assert doc["config"]["transport"] == "shm" and doc["config"]["producer_kind"] == "decode"
    for name in ("zmq-consume", "loader", "gpu-decode"):  # each decodes on input cores of its own
        f = paths[name]["feeding"]
        assert f["input_cores"] > 0 and f["images_per_sec_per_input_core"] > 0, (name, f)
        assert [n["devices"] for n in f["needs"]] == [1, 8], (name, f)
        # A figure where its cores were its limit; none where they were not (busy on under 70% of them).
        assert all((n["cores_needed"] >= 1) if f["core_bound"] else n["cores_needed"] is None for n in f["needs"])
    assert "decode producers" in paths["zmq-consume"]["feeding"]["decoder"]
    assert "torchvision_imagefolder" in paths["loader"]["feeding"]["decoder"]
    assert paths["gpu-decode"]["feeding"]["decoder"].endswith("on cpu")
    assert "feeding the model from" in out and "cores for 8 x" in out


def test_decode_batch_names_the_file_it_cannot_decode(folder) -> None:
    torch = pytest.importorskip("torch")
    from consumers.gpu_decode.torch import UndecodableFile, augment, decode_batch

    files, _, _ = list_images(folder)
    items = strings.of([(folder / f).read_bytes() for f in files[:3]] + [b"\xff\xd8 cut short"])
    with pytest.raises(UndecodableFile, match=f"cannot decode {files[3]} on cpu"):
        decode_batch(items, torch.device("cpu"), files[:3] + [files[3]])
    images = decode_batch(items[:3], torch.device("cpu"), files[:3])
    out = augment(images, 24, __import__("random").Random(0))
    assert out.shape == (3, 24, 24, 3) and out.dtype == torch.uint8
    assert np.asarray(out).std() > 0  # real pixels, not an empty buffer


@pytest.mark.timeout(120)
def test_byte_strings_in_a_shm_slot_are_checked_against_the_slot(ep) -> None:
    """A slot's length table is read once the slot is taken: lengths past the slot's end are a named rejection."""
    import struct

    import zmq

    from wire import WireError, shm

    files = [b"\xff\xd8" + bytes(range(k * 10 % 256)) for k in range(5)]
    batch = [strings.of(files), np.arange(5, dtype=np.int32)]
    region = shm.Region(2, shm.layout(batch)[1])
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    try:
        with PullConsumer(ep, recv_timeout=30) as consumer:
            push.connect(shm.zmq_endpoint(ep))
            assert region.hand_over(ep)
            for seq, lengths in enumerate([None, [2**40, 0, 0, 0, 0], [2**64 - 1, 1, 0, 0, 0]]):
                offsets = region.write(0, batch)
                if lengths is not None:  # a table that names more bytes than the slot holds
                    region._data[offsets[0] : offsets[0] + 40] = np.frombuffer(struct.pack("<5Q", *lengths), np.uint8)
                region.publish(0)
                push.send_multipart(shm.encode(batch, 0, seq, region.name, 0, offsets))
                if lengths is None:
                    got = consumer.recv().arrays
                    assert list(got[0]) == files and got[1].tolist() == list(range(5))
                    continue
                with pytest.raises(WireError, match=r"tensor\[0\]\.lengths: .*overrun"):
                    consumer.recv()
                assert region._state[0] == shm.FREE  # the slot went back to its producer
    finally:
        push.close(0)
        ctx.term()
        region.close()


def test_the_real_data_table_gives_no_figure_for_a_model_that_did_not_train() -> None:
    """The H200 run of 2026-11-28 (docs/gpu-runs/2026-11-28-h200/real_data-p4.json): every path's loss went
    non-finite in the warm-up; its ratios and cores per image were printed all the same, beside "invalid"."""
    from types import SimpleNamespace

    from profiler.real_data import text

    doc = json.loads((ROOT / "docs/gpu-runs/2026-11-28-h200/real_data-p4.json").read_text())
    results = doc["paths"]
    cfg = SimpleNamespace(data="DIR", num_gpus=1, loader=None, producers=4)
    out = text(results, "gpu", cfg)
    rows = {ln.split()[0]: ln for ln in out.splitlines()[3:7]}
    for name in ("zmq-consume", "loader", "gpu-decode"):
        assert rows[name].split()[1] == "invalid", out
        assert "1,527" not in rows[name] and "0.13" not in rows[name], out
    assert "invalid: the path's model did not train" in out


@pytest.mark.parametrize("producers", [4, 12])
def test_cores_needed_are_not_extrapolated_where_the_input_cores_were_not_the_limit(producers) -> None:
    """gpu-decode on the H200 (docs/gpu-runs/2026-11-28-h200): 1.2 of 4 and 2.5 of 12 producer cores busy while
    it fell short, so its limit was its decoding on the rank; the table said 31 and then 52 cores would feed 8
    devices. Read as though the model had trained, the cores-needed rows say what limited each path instead."""
    from types import SimpleNamespace

    from profiler.real_data import text

    doc = json.loads((ROOT / f"docs/gpu-runs/2026-11-28-h200/real_data-p{producers}.json").read_text())
    for r in doc["paths"].values():
        r["training"]["invalid"], r["loss_finite"] = None, True
    out = text(doc["paths"], "gpu", SimpleNamespace(data="DIR", num_gpus=1, loader=None, producers=producers))
    needs = {ln.split()[0]: ln for ln in out.split("cores for 1 x")[1].splitlines()[2:6]}
    assert "not core-bound" in needs["gpu-decode"], out
    assert doc["paths"]["gpu-decode"]["feeding"]["core_bound"] is False
    assert all(n["cores_needed"] is None for n in doc["paths"]["gpu-decode"]["feeding"]["needs"])
    assert "not core-bound" not in needs["zmq-consume"], out  # its producers' cores were busy: their figure holds
