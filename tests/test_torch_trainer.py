"""The PyTorch trainer: every path trains two ranks (two gloo processes on torchrun), the accounting is exact,
two machines rendezvous on loopback, and flags without meaning in PyTorch are refused in one line."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import psutil
import pytest
from conftest import ROOT
from path_lists import default_paths, producer_paths

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(400)

SMALL = ["--batch", "2", "--image-size", "32", "--warmup-steps", "1", "--steps", "2", "--repeats", "1"]
NEEDED = 1 + 2 * 1  # warm-up + steps x repeats, per rank
HAS_RECEIVER = (ROOT / "zmq_ops" / "receiver.py").exists()  # the TF-free native receiver
# The default run (zmq-consume where its TF-free receiver is built), and the two paths on request that run on
# this machine's CPU with no more flags (loader needs --loader, gpu-decode a GPU).
PATHS = [p for p in default_paths("torch") if p != "zmq-consume" or HAS_RECEIVER] + ["dali", "spdl"]
PRODUCER_PATHS = set(producer_paths("torch"))


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> str:
    from producers.dataset import make_dataset

    root = tmp_path_factory.mktemp("jpegs")
    make_dataset(root, classes=2, per_class=4)
    return str(root)


@pytest.fixture(scope="module")
def every_path(jpegs, tmp_path_factory) -> dict:
    """One torchrun launch, two CPU ranks (gloo), training every PyTorch path in turn."""
    from consumers.expect import receive_cap
    from core.config import BenchConfig, apply_defaults
    from harness.torch.launch import Nodes, launch

    cfg = BenchConfig(
        paths=[p for p in PATHS if p != "spdl" or importlib.util.find_spec("spdl")],
        num_gpus=2, batch=2, image_size=32, warmup_steps=1, steps=2, repeats=1, producers=2,
        data=jpegs, recv_timeout=60,
    )  # fmt: skip
    apply_defaults(cfg, 0)
    cfg.max_msg_size = receive_cap(cfg.batch, cfg.image_size)
    folder = str(tmp_path_factory.mktemp("run"))
    rc, doc, errors = launch(2, Nodes(), cfg.to_dict(), folder)
    assert rc == 0 and not errors, errors
    # Nothing the run started outlives it: ranks, loader workers, producers (their endpoints are in `folder`).
    left = [p for p in psutil.process_iter(["cmdline"]) if folder in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
    return doc["paths"]


@pytest.mark.parametrize("path", PATHS)
def test_every_path_trains_two_ranks_with_finite_loss(every_path, path):
    if path == "spdl" and path not in every_path:
        pytest.skip("spdl is not installed")
    r = every_path[path]
    assert [p["rank"] for p in r["ranks"]] == [0, 1]
    assert r["steps_run"] == NEEDED and r["batches_trained"] == 2 * NEEDED
    assert r["loss_finite"] and math.isfinite(r["final_loss"]) and r["final_loss"] > 0
    assert r["training"]["invalid"] is None and all(w["loss_finite"] for w in r["training"]["windows"])
    assert r["images_per_sec"]["median"] > 0
    assert r["images_per_sec_per_device"]["median"] == pytest.approx(r["images_per_sec"]["median"] / 2)
    tel = r["telemetry"]
    assert 0 <= tel["input_wait_share"] <= 1 and len(tel["per_rank"]) == 2
    # The TensorFlow cluster's rule: a rank is named only when the others wait for it; always a reason.
    assert r["straggler"]["rank"] in (0, 1, None) and r["straggler"]["why"]


@pytest.mark.parametrize("path", sorted(PRODUCER_PATHS & set(PATHS)))
def test_producer_paths_account_for_every_batch(every_path, path):
    """Each rank pulls from its own producer (ids 0 and 1000 for --producers 2), nothing lost or repeated."""
    from consumers.python_queue.torch import PythonQueue
    from consumers.zmq_consume.torch import SLOTS

    r = every_path[path]
    rows = r["producers"]
    assert {(row["rank"], row["producer"]) for row in rows} == {(0, 0), (1, 1000)}
    assert all(row["lost"] == 0 and row["duplicated"] == 0 and row["restarts"] == 0 for row in rows)
    assert sum(row["received"] for row in rows) == r["batches_pulled"]
    ahead = {"python-dataset": 0, "python-queue": PythonQueue.depth + 1, "zmq-consume": SLOTS}[path]
    for pulled in r["batches_pulled_per_rank"]:
        # Every batch trained on was pulled once; at most `ahead` more wait in the feeder's buffers.
        assert NEEDED <= pulled <= NEEDED + ahead


@pytest.mark.parametrize("path", ["dali", "spdl"])
def test_in_process_loaders_feed_exactly_the_steps(every_path, path):
    if path not in every_path:
        pytest.skip(f"{path} is not installed")
    assert every_path[path]["batches_pulled_per_rank"] == [NEEDED, NEEDED]


def test_the_trainer_imports_no_tensorflow():
    code = (
        "import sys, consumers.declared as d; d.load('torch'); import harness.torch.run, harness.torch.launch;"
        "sys.exit('tensorflow' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_two_machines_on_loopback(procs, tmp_path):
    """Two launches of bench_input.py, one rank each, rendezvous at 127.0.0.1; node 0 writes one report."""
    from wire.endpoints import free_tcp_port

    port = str(free_tcp_port())
    out_json = tmp_path / "r.json"
    common = ["--framework", "torch", "--num-gpus", "1", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", port, "--fake-location", "python-queue", "--producers", "2", *SMALL]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")  # two "machines" share this host's cores
    node1 = procs.start("bench_input.py", *common, "--node-rank", "1", env=env)
    node0 = procs.start("bench_input.py", *common, "--node-rank", "0", "--json", str(out_json), env=env)
    out0, err0 = node0.communicate(timeout=300)
    out1, err1 = node1.communicate(timeout=60)
    assert node0.returncode == 0, err0
    assert node1.returncode == 0, err1
    assert "node 0 writes the report" in out1
    doc = json.loads(out_json.read_text())
    assert doc["framework"] == "torch" and doc["device"]["nodes"] == 2 and doc["device"]["ranks"] == 2
    q = doc["paths"]["python-queue"]
    assert [p["rank"] for p in q["ranks"]] == [0, 1]
    # The run's two producers split across the two machines' ranks.
    assert {(row["rank"], row["producer"]) for row in q["producers"]} == {(0, 0), (1, 1000)}
    assert q["verdict"]["level"] and doc["paths"]["gpu"]["ratio_to_baseline"] == 1.0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--variable-update", "parameter_server"], ["--variable-update parameter_server", "DistributedDataParallel"]),
        (["--ps-device", "gpu"], ["--ps-device"]),
        (["--nnodes", "2", "--node-rank", "2"], ["--node-rank 2"]),
        (["--fake-location", "dali"], ["--fake-location dali needs --data"]),
    ],
)
def test_flags_without_meaning_in_pytorch_are_refused_in_one_line(procs, tmp_path, args, words):
    out_json = tmp_path / "r.json"
    p = procs.start("bench_input.py", "--framework", "torch", "--fake-location", "gpu", *args, "--json", str(out_json))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1
    for w in words:
        assert w in errors[0]
    assert not out_json.exists()


def test_pytorch_only_path_is_refused_for_tensorflow(procs):
    p = procs.start("bench_input.py", "--fake-location", "spdl")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "spdl" in err.strip().splitlines()[-1]


def test_silent_endpoint_stops_every_rank_with_one_line_and_no_json(procs, ipc_dir, tmp_path):
    out_json = tmp_path / "r.json"
    endpoint = f"ipc://{ipc_dir}/ext"
    p = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", "python-queue", "--endpoint", endpoint,
        "--recv-timeout", "2", "--input-only", *SMALL, "--json", str(out_json),
    )  # fmt: skip
    out, err = p.communicate(timeout=200)
    assert p.returncode == 2, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and "python-queue" in errors[0] and f"{endpoint}-r" in errors[0]
    assert "waiting for external producers" in out
    assert not out_json.exists()


def test_sweep_runs_one_launch_per_grid_point(procs, tmp_path):
    """Each batch size its own launch; the engines table (benchmarks/engines.py) reads every path's input CPU
    from the PyTorch ranks' own meter."""
    out = tmp_path / "sweep"
    p = procs.start(
        "bench_input.py", "--framework", "torch", "--sweep", "--fake-location", "gpu,zmq-consume", "--input-only",
        "--num-gpus", "1", "--batch", "2,4", "--image-size", "32", "--warmup-steps", "1", "--steps", "2",
        "--repeats", "1", "--producers", "1", "--out", str(out),
    )  # fmt: skip
    stdout, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    doc = json.loads((out / "results.json").read_text())
    assert [r["config"]["batch"] for r in doc["runs"]] == [2, 4]
    assert all(r["config"]["framework"] == "torch" for r in doc["runs"])
    assert {f.name for f in out.iterdir()} >= {"results.json", "results.csv", "results.md"}
    table = procs.start("-m", "benchmarks.engines", str(out / "results.json"))
    stdout, err = table.communicate(timeout=60)
    assert table.returncode == 0, err
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["gpu", "zmq-consume"] * 2, stdout
    assert all(float(r[3]) >= 0 for r in rows), stdout  # input CPU ms/image: a figure, not "not measured"


def test_dali_says_where_it_decoded(every_path):
    if "dali" not in every_path:
        pytest.skip("dali is not installed")
    r = every_path["dali"]
    assert r["decoded_on"] == [{"rank": 0, "on": "cpu"}, {"rank": 1, "on": "cpu"}]  # no GPU here: DALI's CPU mode
    assert "decoded_on" not in every_path["python-queue"]  # synthetic producers decode nothing


def test_spdls_loader_skips_a_file_that_is_not_a_jpeg_naming_it_once(tmp_path, capsys):
    """A PNG named .JPEG (ImageNet has some): the next file of the shard takes its place, one line names it, and
    no exception reaches SPDL (which logged a traceback for every such task)."""
    from PIL import Image

    from consumers.spdl.torch import _loader
    from core.images.files import list_images

    for name in ("a", "b", "c"):
        (tmp_path / "cls").mkdir(exist_ok=True)
        image = Image.new("RGB", (40, 30), (10, 200, 30))
        image.save(tmp_path / "cls" / f"{name}.JPEG", format="PNG" if name == "b" else "JPEG")
    files, labels, _ = list_images(str(tmp_path), None)
    png = next(i for i, f in enumerate(files) if f.endswith("b.JPEG"))
    skipped: set[int] = set()
    load = _loader(files, labels, tmp_path, 16, list(range(len(files))), skipped, rank=0)
    for _ in range(2):
        image, label = load(png)
        assert image.shape == (16, 16, 3) and abs(int(image[..., 1].mean()) - 200) < 10
    assert skipped == {png}
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "skipping" in ln]
    assert len(lines) == 1 and lines[0].endswith("b.JPEG: not a JPEG but PNG"), lines
