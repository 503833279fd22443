"""ray-data: a real Ray cluster (gcs_server, raylet, workers on 127.0.0.1 ports), every image delivered once.

Each run starts its own cluster (the path's default): ResNet-50 on two torchrun ranks (gloo, synthetic
images), the stand-in decoding a JPEG folder through the command line, one run interrupted with SIGINT
while its cluster is up, and three runs whose cluster fails under them (a task's worker or the split's
coordinator SIGKILLed mid-run, the coordinator SIGSTOPped). Ray is kept small (one CPU, 32x32 images) so
the module stays within a few minutes on two cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from conftest import descendants
from listening import only_loopback
from schema import check_report

pytest.importorskip("ray.data")
pytestmark = pytest.mark.timeout(400)
PATH = "ray-data"
SMALL = ["--batch", "2", "--image-size", "32", "--warmup-steps", "1", "--steps", "2", "--repeats", "1"]
NEEDED = 1 + 2 * 1  # warm-up + steps x repeats, per rank
ENGINE = ("gcs_server", "raylet")  # the head's servers; its workers are named ray::<task>


def is_engine(p: psutil.Process) -> bool:
    """A Ray process: the GCS, the raylet, an agent or a worker (their command lines name ray)."""
    try:
        name, cmd = p.name(), " ".join(p.cmdline())
    except psutil.Error:
        return False
    return name in ENGINE or name.startswith("ray::") or "site-packages/ray/" in cmd


@pytest.fixture
def short_tmp():
    """A TMPDIR short enough for Ray's sockets (AF_UNIX paths: 107 bytes), empty, removed after."""
    folder = tempfile.mkdtemp(prefix="fbr", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def left_in(tmp: str) -> list[str]:
    """What a run left in its TMPDIR, but torch's compile cache (torchinductor_<user>, kept on purpose)."""
    return [f for f in os.listdir(tmp) if not f.startswith("torchinductor_")]


def _delivered_once(r: dict, ranks: int) -> None:
    """Every image the steps took came once, over the ranks, from the pipeline's sequence numbers."""
    images = r["images"]
    assert images["duplicated"] == 0 and images["distinct"] == images["received"] == ranks * NEEDED * 2
    assert [x["received"] for x in images["ranks"]] == [NEEDED * 2] * ranks


def test_resnet50_trains_on_two_ranks_and_every_image_comes_once(tmp_path):
    from consumers.expect import receive_cap
    from core.config import BenchConfig, apply_defaults
    from harness.torch.launch import Nodes, launch

    cfg = BenchConfig(
        paths=[PATH], num_gpus=2, batch=2, image_size=32, warmup_steps=1, steps=2, repeats=1, ray_cpus=1,
        recv_timeout=60,
    )  # fmt: skip
    apply_defaults(cfg, 0)
    cfg.max_msg_size = receive_cap(cfg.batch, cfg.image_size)
    rc, doc, errors = launch(2, Nodes(), cfg.to_dict(), str(tmp_path))
    assert rc == 0 and not errors, errors
    r = doc["paths"][PATH]
    assert [p["rank"] for p in r["ranks"]] == [0, 1] and r["batches_trained"] == 2 * NEEDED
    assert r["loss_finite"] and r["final_loss"] > 0
    _delivered_once(r, 2)
    ray = r["ray"]
    assert ray["started_here"] and ray["cpus"] == 1 and ray["address"].startswith("127.0.0.1:")
    names = [op["name"] for op in ray["operators"]]
    assert any(n.startswith("ReadRange") for n in names) and any("MapBatches" in n for n in names), names
    assert ray["workers"] and all(w["cpu_cores"] is None or w["cpu_cores"] >= 0 for w in ray["workers"])
    assert [x["rank"] for x in ray["ranks"]] == [0, 1] and all(x["images_per_sec"] > 0 for x in ray["ranks"])


def _stand_in(procs, short_tmp: str, tmp_path, *extra: str) -> dict:
    """The stand-in from the command line on a Ray cluster of one CPU: its ray-data result, schema-checked."""
    out = tmp_path / "r.json"
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", PATH, "--num-gpus", "1", "--input-only",
        "--ray-cpus", "1", *SMALL, *extra, "--json", str(out), env={**os.environ, "TMPDIR": short_tmp},
    )  # fmt: skip
    stdout, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    doc = json.loads(out.read_text())
    check_report(doc)
    return doc["paths"][PATH]


def test_the_stand_in_decodes_a_folder_from_the_command_line_and_matches_the_schema(procs, short_tmp, tmp_path):
    from producers.dataset import make_dataset

    make_dataset(tmp_path / "data", classes=2, per_class=4, seed=1)
    r = _stand_in(procs, short_tmp, tmp_path, "--producer-kind", "decode", "--data", str(tmp_path / "data"),
                  "--ray-block-batches", "3")  # fmt: skip
    _delivered_once(r, 1)
    assert r["ratio_to_baseline"] > 0 and 0 <= r["telemetry"]["input_wait_share"] <= 1
    assert any("decoded_rows" in op["name"] for op in r["ray"]["operators"])
    # Blocks of 3 batches of 2: 7 batches needed (3 steps, 2 prefetched, a spare) make 3 blocks of 6 rows.
    read = next(op for op in r["ray"]["operators"] if op["name"] == "ReadRange")
    assert r["ray"]["block_batches"] == 3 and "6 max" in read["figures"]["Output num rows per block"], read
    assert not left_in(short_tmp)  # the cluster's temp folder is gone with it


LOADER = "examples/torchvision_imagefolder.py"


def test_the_stand_in_reads_a_map_style_loader_in_ray_actors_and_every_image_comes_once(procs, short_tmp, tmp_path):
    """--loader's Dataset (an ImageFolder) read by index in the pipeline's actors, from another folder."""
    from producers.dataset import make_dataset

    make_dataset(tmp_path / "data", classes=2, per_class=2, seed=1)
    r = _stand_in(procs, short_tmp, tmp_path, "--loader", f"{LOADER}:make_dataset", "--loader-arg",
                  f"data={tmp_path / 'data'}")  # fmt: skip
    _delivered_once(r, 1)  # 6 images of a 4-image dataset: sequence numbers, not samples, are counted
    assert any("MapBatches(LoaderRows)" in op["name"] for op in r["ray"]["operators"]), r["ray"]["operators"]
    assert f"running loader {LOADER}:make_dataset" in r["input"]["batch_maker"]["name"]
    assert not left_in(short_tmp)


def test_a_loader_that_is_not_map_style_is_refused_in_one_line_before_ray_starts(procs, short_tmp, tmp_path):
    from producers.dataset import make_dataset

    make_dataset(tmp_path / "data", classes=2, per_class=1, seed=1)
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", PATH, "--num-gpus", "1", "--input-only",
        "--loader", f"{LOADER}:make_loader", "--loader-arg", f"data={tmp_path / 'data'}", "--loader-arg",
        "num_workers=0", *SMALL, env={**os.environ, "TMPDIR": short_tmp},
    )  # fmt: skip
    stdout, err = run.communicate(timeout=120)
    assert run.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [
        f"error: {PATH}: loader {Path(__file__).parent.parent / LOADER}:make_loader: it returns a torch DataLoader; "
        "Ray Data hands its tasks rows by index, so --fake-location ray-data needs samples by index: return a "
        "map-style dataset (__getitem__ and __len__, e.g. the Dataset behind your DataLoader), or run this loader as "
        "producers (--fake-location zmq-consume) or inside the trainer (--fake-location loader)"
    ], err[-3000:]
    assert not left_in(short_tmp)


def test_a_sample_the_model_cannot_take_or_that_raises_is_one_line_naming_the_loader_and_the_sample():
    """What an actor reads for a row (consumers/ray_data/loader_rows.py `read`), without Ray: sample seq mod len."""
    import numpy as np

    from consumers.ray_data.loader_rows import read
    from core.loader_spec import LoaderError

    class Samples:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            if i == 2:
                raise ValueError("corrupt record 2")
            return (np.zeros((8, 8, 3), np.uint8) if i == 0 else np.zeros((3, 8, 8), np.uint8)), i

    image, label = read(Samples(), "my.py:make", 3, 6, 8)  # row 6: sample 0
    assert image.shape == (8, 8, 3) and label == 0
    for seq, line in [
        (4, "loader my.py:make: sample 1: images are NCHW (1, 3, 8, 8); the model takes NHWC: x.permute(1, 2, 0) "
         "in a per-sample transform, x.permute(0, 2, 3, 1) on a batch (numpy: transpose with the same axes)"),
        (5, "loader my.py:make: sample 2 raised ValueError: corrupt record 2"),
    ]:  # fmt: skip
        with pytest.raises(LoaderError) as e:
            read(Samples(), "my.py:make", 3, seq, 8)
        assert str(e.value) == line


def _wait_for_cluster(run, deadline: float) -> list[psutil.Process]:
    """The run's Ray processes once its raylet has a worker running the pipeline."""
    while True:
        engine = [p for p in descendants(run.pid) if is_engine(p)]
        if any(p.name() == "raylet" for p in engine) and any(p.name().startswith("ray::") for p in engine):
            return engine
        assert run.poll() is None, run.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no Ray cluster came up"
        time.sleep(0.2)


def _listening(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out += [c.laddr.ip for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
    return out


def test_sigint_leaves_no_ray_process_and_no_temp_folder_and_ray_listens_on_loopback_only(procs, short_tmp):
    token = Path.home() / ".ray" / "auth_token"
    had_token = token.exists()
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", PATH, "--num-gpus", "1", "--input-only",
        "--ray-cpus", "1", "--batch", "2", "--image-size", "32", "--steps", "20000", "--repeats", "1",
        env={**os.environ, "TMPDIR": short_tmp},
    )  # fmt: skip
    engine = _wait_for_cluster(run, time.monotonic() + 240)
    assert any(p.name() == "gcs_server" for p in engine)
    addresses = _listening(engine)
    assert addresses and only_loopback(addresses), addresses
    run.send_signal(signal.SIGINT)
    assert run.wait(60) == 130
    _nothing_left(engine, short_tmp)
    assert token.exists() == had_token  # the run's token never went to ~/.ray


def _nothing_left(engine: list[psutil.Process], tmp: str) -> None:
    """No Ray process of the run's (those seen, and any naming its TMPDIR) and nothing in its TMPDIR."""
    gone, alive = psutil.wait_procs(engine, timeout=15)
    assert not alive, [p.name() for p in alive]
    assert not [p for p in psutil.process_iter() if is_engine(p) and tmp in " ".join(_cmd(p))]
    assert not left_in(tmp)  # no Ray session folder, no run folder


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.mark.parametrize(
    "kw, line",
    [
        ({"producer_kind": "read"}, "--fake-location ray-data with --producer-kind read: its pipeline does synthetic "
         "or decode work (--producer-kind synthetic|decode), or your --loader's map-style dataset"),
        ({"producer_kind": "decode"}, "--fake-location ray-data needs --data DIR, a JPEG folder (make one: python -m "
         "producers make-dataset DIR)"),
        ({"ray_address": "nohost"}, "--ray-address nohost: expected HOST:PORT (a Ray head's GCS address)"),
    ],
)  # fmt: skip
def test_flags_it_cannot_work_with_are_refused_in_one_line(kw, line):
    from consumers import declared
    from core.config import BenchConfig
    from core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        declared.of("torch")[PATH].check(BenchConfig(**kw), "torch")
    assert str(e.value) == line


def test_an_unreachable_ray_address_is_one_line_naming_it():
    from consumers import declared
    from core.config import BenchConfig
    from core.errors import ConfigError
    from wire.endpoints import free_tcp_port

    port = free_tcp_port()
    with pytest.raises(ConfigError) as e:
        declared.of("torch")[PATH].check(BenchConfig(ray_address=f"127.0.0.1:{port}", recv_timeout=5), "torch")
    assert (
        str(e.value) == f"--ray-address 127.0.0.1:{port}: no Ray head reachable there (connection refused within 5 s)"
    )


def test_an_image_two_ranks_both_took_counts_as_duplicated():
    """The merge over the ranks joins each rank's ranges: an image on two ranks is one distinct, one twice."""
    from consumers.ray_data.path import IMAGES

    ranks = [
        (0, {"received": 4, "distinct": 4, "ranges": [[0, 4]]}),
        (1, {"received": 4, "distinct": 4, "ranges": [[3, 7]]}),
    ]
    merged = IMAGES.merge("images", ranks)["images"]
    assert (merged["received"], merged["distinct"], merged["duplicated"]) == (8, 7, 1)


def test_a_temp_folder_too_long_for_rays_sockets_is_one_line_naming_it_and_is_removed(tmp_path, monkeypatch):
    from consumers.ray_data.cluster import RayCluster
    from core.errors import InputError

    deep = tmp_path / ("t" * 80)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(InputError) as e:
        RayCluster.local()
    line = str(e.value)
    assert line.startswith(f"ray-data: the temp folder {deep}/feedbench-ray-") and "set TMPDIR" in line, line
    assert "\n" not in line and not os.listdir(deep)


MID_RUN = ["--warmup-steps", "1", "--steps", "40", "--repeats", "3"]  # ray-data's first window ends mid-run


def _mid_run(procs, tmp: str, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    """A run whose ray-data path has delivered its first timed window (the run and its stdout so far)."""
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", PATH, "--num-gpus", "1", "--input-only",
        "--ray-cpus", "1", "--batch", "2", "--image-size", "32", *MID_RUN, *extra, env={**os.environ, "TMPDIR": tmp},
    )  # fmt: skip
    printed: list[str] = []
    for line in run.stdout:
        printed.append(line)
        if any(ln.startswith(f"- {PATH}") for ln in printed) and "window 1/3" in line:
            return run, printed
    raise AssertionError(f"the run ended before its first ray-data window: {run.stderr.read()[-3000:]}")


def _worker(run, named: tuple[str, ...], deadline: float) -> psutil.Process:
    """The run's Ray worker whose process title names one of `named` (the task or actor it is running)."""
    while True:
        for p in descendants(run.pid):
            try:
                if p.name().startswith("ray::") and any(n in p.name() for n in named):
                    return p
            except psutil.Error:
                continue
        assert run.poll() is None, f"the run ended with no Ray worker running {named}"
        assert time.monotonic() < deadline, f"no Ray worker running {named}"
        time.sleep(0.05)


def test_a_ray_worker_killed_mid_run_is_named_and_the_run_counts_every_image(procs, short_tmp, tmp_path):
    """A worker running the pipeline's tasks, SIGKILLed: Ray retries its task, the run goes on and says so."""
    out = tmp_path / "r.json"
    # A batch a block: the pipeline's tasks run all through the run (blocks of 8 tiny batches are all made
    # before the first window ends, and no task is left to kill).
    run, printed = _mid_run(procs, short_tmp, "--ray-block-batches", "1", "--json", str(out))
    worker = _worker(run, ("ReadRange", "MapBatches"), time.monotonic() + 60)
    engine = [p for p in descendants(run.pid) if is_engine(p)]
    worker.kill()
    stdout, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    assert f"warning: ray-data: Ray worker {worker.pid} on 127.0.0.1 died mid-run (SYSTEM_ERROR: " in stdout, stdout
    r = json.loads(out.read_text())["paths"][PATH]
    assert [(d["pid"], d["ip"], d["exit_type"]) for d in r["ray"]["workers_died"]] == [
        (worker.pid, "127.0.0.1", "SYSTEM_ERROR")
    ]
    images = r["images"]  # every batch the steps took counted, each image once or said twice
    assert images["received"] == 2 * (1 + 3 * 40) == images["distinct"] + images["duplicated"], images
    _nothing_left(engine, short_tmp)


def _gcs_ports(engine: list[psutil.Process]) -> set[int]:
    gcs = [p for p in engine if p.name() == "gcs_server"]
    return {c.laddr.port for p in gcs for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def test_the_splits_coordinator_killed_mid_run_ends_the_run_in_one_line_naming_the_worker(procs, short_tmp):
    run, _ = _mid_run(procs, short_tmp)
    coordinator = _worker(run, ("SplitCoordinator",), time.monotonic() + 60)
    engine = [p for p in descendants(run.pid) if is_engine(p)]
    ports = _gcs_ports(engine)
    coordinator.kill()
    stdout, err = run.communicate(timeout=120)
    assert run.returncode != 0
    line = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(line) == 1, err[-3000:]
    m = re.fullmatch(
        rf"error: ray-data: Ray worker {coordinator.pid} on 127\.0\.0\.1 \(SplitCoordinator\) of the cluster at "
        r"127\.0\.0\.1:(\d+) died \(SYSTEM_ERROR: .+\)",
        line[0],
    )
    assert m and int(m[1]) in ports, (line[0], ports)
    _nothing_left(engine, short_tmp)


def test_a_hung_cluster_ends_the_run_at_the_receive_timeout_in_one_line_naming_it(procs, short_tmp):
    """The split's coordinator stopped (SIGSTOP) as soon as it is there: no rank gets a batch any more."""
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", PATH, "--num-gpus", "1", "--input-only",
        "--ray-cpus", "1", *SMALL, "--recv-timeout", "5", env={**os.environ, "TMPDIR": short_tmp},
    )  # fmt: skip
    coordinator = _worker(run, ("SplitCoordinator",), time.monotonic() + 240)
    coordinator.suspend()
    engine = [p for p in descendants(run.pid) if is_engine(p)]
    ports = _gcs_ports(engine)
    stdout, err = run.communicate(timeout=120)
    assert run.returncode != 0
    line = [ln for ln in err.splitlines() if ln.strip()]
    m = re.fullmatch(r"error: ray-data: no batch from the Ray cluster at 127\.0\.0\.1:(\d+) within 5 s", line[-1])
    assert m and int(m[1]) in ports and len(line) == 1, (err[-3000:], ports)
    _nothing_left(engine, short_tmp)  # the stopped coordinator killed with the rest
