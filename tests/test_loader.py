"""The user's own loader (--loader MODULE:CALLABLE): as producer processes, alone, stage by stage, and in a run.

Real processes throughout: `python -m producers loader` into a real consumer,
`bench_input.py --loader-only` and full runs; the bad loaders are real
modules that yield floats, NCHW, raise on their 10th batch or hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import QUICK_PROBE_FLAGS

from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from tests.schema import check_figures

ROOT = Path(__file__).resolve().parent.parent
TV = "examples/torchvision_imagefolder.py"
TF_DATA = "examples/tf_data_jpeg.py:make_dataset"
DATAFLOW = "examples/tensorpack_dataflow.py:make_dataflow"

pytestmark = pytest.mark.timeout(600)

BAD = """
import time
import numpy as np

def good():
    while True:
        yield np.ones((2, 8, 8, 3), np.uint8), np.arange(2)

def floats():
    while True:
        yield np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int64)

def nchw():
    while True:
        yield np.zeros((2, 3, 8, 8), np.uint8), np.zeros(2, np.int64)

def raises_on_10th():
    for i in range(100):
        if i == 9:
            raise ValueError("corrupt record 9")
        yield np.zeros((2, 8, 8, 3), np.uint8), np.zeros(2, np.int64)

def hangs():
    yield np.zeros((2, 8, 8, 3), np.uint8), np.zeros(2, np.int64)
    time.sleep(3600)
    yield np.zeros((2, 8, 8, 3), np.uint8), np.zeros(2, np.int64)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """A small ImageNet-layout folder of real JPEGs (the bundled photographs)."""
    root = tmp_path_factory.mktemp("loader-data") / "data"
    subprocess.run(
        [sys.executable, "-m", "producers", "make-dataset", str(root), "--classes", "2", "--per-class", "8"],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return str(root)


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("loaders") / "bad_loaders.py"
    path.write_text(BAD)
    return str(path)


def start(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,
    )  # fmt: skip


def finish(p: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"still running after {timeout} s: {err[-2000:]}")
    return p.returncode, out, err


def left_in_session(sid: int, deadline_s: float = 15.0) -> list[str]:
    """Processes still in the session `sid` (the command's and everything it started), after a grace period."""
    end = time.monotonic() + deadline_s
    while True:
        left = []
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    left.append(" ".join(proc.info["cmdline"] or []))
            except (OSError, psutil.Error):
                continue
        if not left or time.monotonic() > end:
            for proc in psutil.process_iter():
                try:
                    if os.getsid(proc.pid) == sid:
                        proc.kill()
                except (OSError, psutil.Error):
                    pass
            return left
        time.sleep(0.2)


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("error")]


# --------------------------------------------------------------------------- as producer processes


def _receive(endpoint: str, loader: str, n: int, *extra: str) -> tuple[list, subprocess.Popen]:
    with PullConsumer(endpoint, recv_timeout=180) as c:
        p = start("-m", "producers", "loader", "--endpoint", endpoint, "--quiet", "--loader", loader, *extra)
        got = [c.recv() for _ in range(n)]
    return got, p


def test_a_torch_dataloader_runs_as_producer_workers_each_with_its_own_seed(data, ipc_dir):
    """Two workers, each its own DataLoader (with a worker process of its own) and shard of the seed."""
    got, p = _receive(
        f"ipc://{ipc_dir}/feed", f"{TV}:make_loader", 6,
        "--loader-arg", f"data={data}", "--loader-arg", "num_workers=1",
        "--batch", "4", "--image-size", "32", "--workers", "2", "--count", "6",
    )  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 0, err
    assert all(b.arrays[0].shape == (4, 32, 32, 3) and b.arrays[0].dtype == np.uint8 for b in got)
    assert all(b.arrays[1].dtype == np.int32 and set(b.arrays[1]) <= {0, 1} for b in got)
    by_worker: dict[int, list[bytes]] = {}
    for b in got:
        by_worker.setdefault(b.header.producer_id, []).append(b.arrays[0].tobytes())
    assert sorted(by_worker) == [0, 1]
    assert by_worker[0][0] != by_worker[1][0], "workers must draw from their own seeds"
    assert left_in_session(p.pid) == []


def test_a_map_style_dataset_is_batched_by_feedbench(data, ipc_dir):
    got, p = _receive(
        f"ipc://{ipc_dir}/feed", f"{TV}:make_dataset", 3,
        "--loader-arg", f"data={data}", "--batch", "5", "--image-size", "24", "--count", "3",
    )  # fmt: skip
    assert finish(p, 120)[0] == 0
    assert [b.arrays[0].shape for b in got] == [(5, 24, 24, 3)] * 3


@pytest.mark.parametrize("loader", [TF_DATA, DATAFLOW])
def test_tf_data_and_dataflow_examples_run_as_producers(data, ipc_dir, loader):
    got, p = _receive(
        f"ipc://{ipc_dir}/feed", loader, 3,
        "--loader-arg", f"data={data}", "--batch", "4", "--image-size", "32", "--count", "3",
    )  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 0, err
    images = [b.arrays[0] for b in got]
    assert all(i.shape == (4, 32, 32, 3) and i.dtype == np.uint8 and i.any() for i in images)


def test_a_producer_checks_the_batch_against_the_consumers_signature(bad, ipc_dir):
    """The model takes 16x16 batches of 4: a loader of 8x8 batches of 2 is refused, naming both."""
    endpoint = f"ipc://{ipc_dir}/feed"
    p = start("-m", "producers", "loader", "--endpoint", endpoint, "--quiet", "--loader", f"{bad}:good",
              "--batch", "2", "--image-size", "16")  # fmt: skip
    with PullConsumer(endpoint, recv_timeout=60):
        code, _, err = finish(p, 120)
    assert code != 0
    [line] = error_lines(err)
    assert f"{bad}:good" in line and "8x8" in line and "16x16" in line and "--image-size 8" in line


# --------------------------------------------------------------------------- bad loaders: one line, nothing left


BAD_CASES = {
    "floats": "images are float32 (2, 8, 8, 3); the model takes uint8 NHWC",
    "nchw": "images are NCHW (2, 3, 8, 8)",
    "raises_on_10th": "batch 10 raised ValueError: corrupt record 9",
    "hangs": "no batch for 3 s after batch 1",
}


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_a_bad_loader_alone_gets_one_line_and_leaves_nothing_running(bad, name):
    p = start("bench_input.py", "--loader", f"{bad}:{name}", "--loader-only", "--loader-workers", "1",
              "--loader-seconds", "3", "--loader-timeout", "3", "--no-stages")  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 2, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert f"loader {bad}:{name}" in lines[0] and BAD_CASES[name] in lines[0], lines[0]
    assert "Traceback" not in err
    assert left_in_session(p.pid) == []


@pytest.mark.parametrize("name", ["raises_on_10th", "hangs"])
def test_a_bad_loader_as_a_producer_gets_one_line_and_leaves_nothing_running(bad, ipc_dir, name):
    endpoint = f"ipc://{ipc_dir}/feed"
    with PullConsumer(endpoint, recv_timeout=0.5) as c:
        p = start("-m", "producers", "loader", "--endpoint", endpoint, "--quiet", "--loader", f"{bad}:{name}",
                  "--loader-timeout", "3", "--workers", "2")  # fmt: skip
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline:  # take all it sends, until it stops
            try:
                c.recv()
            except ReceiveTimeout:
                pass
        code, _, err = finish(p, 30)
    assert code != 0
    lines = error_lines(err)
    assert lines and all(f"loader {bad}:{name}" in ln and BAD_CASES[name] in ln for ln in lines), err
    assert len({ln.split(": ", 2)[-1] for ln in lines}) == 1, "the same line from each worker at most"
    assert "Traceback" not in err
    assert left_in_session(p.pid) == []


def test_a_loader_that_cannot_be_found_is_one_line(bad):
    for target, words in [
        (f"{bad}:nothing", "has no nothing"),
        ("no/such/file.py:make", "no such file no/such/file.py"),
        ("justaname", "expected MODULE:CALLABLE"),
    ]:
        code, _, err = finish(start("bench_input.py", "--loader", target, "--loader-only"), 60)
        assert code == 2 and error_lines(err) == [e for e in error_lines(err) if words in e] != [], err


# --------------------------------------------------------------------------- alone: rate, scaling, stages


# Images per second of `loader` over the last argument's seconds, its first batch left out (a script's tail).
TIMED_LOOP = """
images, t0, seconds = 0, None, float(sys.argv[-1])
while True:
    for i, (x, _y) in enumerate(loader):
        if t0 is None:
            if i >= 1:
                t0 = time.perf_counter()
            continue
        images += len(x)
        if time.perf_counter() - t0 >= seconds:
            print(images / (time.perf_counter() - t0))
            sys.exit(0)
"""
PLAIN_LOOP = (
    """
import sys, time
sys.path.insert(0, sys.argv[1])
import torchvision_imagefolder as ex
loader = ex.make_loader(sys.argv[2], batch_size=8, image_size=64, num_workers=0, seed=0)
"""
    + TIMED_LOOP
)


def _plain_loop_rate(data: str, seconds: float) -> float:
    """What a user would write: iterate the same DataLoader, time the batches after a warm-up.

    In a fresh process, as --loader-only's workers are: not in this test process, whose other threads and
    imports (an xdist worker may have loaded TensorFlow) are not the loader's.
    """
    p = start("-c", PLAIN_LOOP, str(ROOT / "examples"), str(data), str(seconds))
    code, text, err = finish(p, 300)
    assert code == 0, err
    return float(text.strip().splitlines()[-1])


def tv_loader(data: str) -> list[str]:
    """The torchvision example at batch 8, 64x64, its DataLoader without workers of its own."""
    return ["--loader", f"{TV}:make_loader", "--loader-arg", f"data={data}", "--loader-arg", "batch_size=8",
            "--loader-arg", "image_size=64", "--loader-arg", "num_workers=0"]  # fmt: skip


@pytest.mark.timing
def test_loader_only_agrees_with_a_plain_loop(data, tmp_path):
    """One worker's rate against the same DataLoader in a plain loop, measured just before and just after it.

    A timing test: it runs alone, and is measured again (tests/conftest.py) when other work spoiled it.
    """
    tv = tv_loader(data)
    js = tmp_path / "one.json"
    before = _plain_loop_rate(data, 3.0)  # 3 s: about 2,000 images at this rate, each window
    p = start("bench_input.py", *tv, "--loader-only", "--loader-workers", "1", "--loader-seconds", "3",
              "--no-stages", "--json", str(js))  # fmt: skip
    code, text, err = finish(p, 300)
    after = _plain_loop_rate(data, 3.0)
    assert code == 0, err
    one = json.loads(js.read_text())["points"][0]
    # The machine's own speed may drift between the two plain loops (484 then 363 images/s, with nothing else
    # running, on a fresh-clone suite): the run in between is compared with the range they span, 10% either way.
    low, high = 0.9 * min(before, after), 1.1 * max(before, after)
    assert low <= one["images_per_sec"] <= high, (
        f"--loader-only {one['images_per_sec']:.0f} img/s, plain loop {before:.0f} and {after:.0f}"
    )


def test_loader_only_sweeps_up_to_the_cores_with_a_demand_and_stages_that_add_up(data, tmp_path):
    """The whole sweep, up to the machine's cores, with a demand, the stages and the plot. No rate is compared
    with another here: the stages' shares are of one sample's own time, so this runs beside other tests."""
    tv = tv_loader(data)
    out = tmp_path / "out"
    p = start("bench_input.py", *tv, "--loader-only", "--loader-seconds", "1", "--emulate", "H100",
              "--num-devices", "8", "--out", str(out))  # fmt: skip
    code, text, err = finish(p, 300)
    assert code == 0, err
    doc = json.loads((out / "loader.json").read_text())
    check_figures(doc)
    assert (out / "loader.png").read_bytes()[:4] == b"\x89PNG"
    assert [r["workers"] for r in doc["points"]][-1] == os.cpu_count()
    # The demand: 8 emulated H100s, and the cores it needs, extrapolated and labelled so.
    assert doc["demand"]["total_images_per_sec"] == 8 * 7000
    assert doc["needs"]["extrapolated"] and doc["needs"]["cores_needed"] >= 1
    assert "extrapolated" in text and "8 x H100" in text
    # Stages: read, decode, each transform; their shares add up to the whole sample within 5%.
    st = doc["stages"]
    names = [s["name"] for s in st["stages"]]
    assert names == ["read", "decode", "RandomResizedCrop", "RandomHorizontalFlip", "ToUint8HWC"]
    assert abs(st["shares_sum"] - 1.0) <= 0.05, st
    assert "decode" in text and "RandomResizedCrop" in text and "slowest stage" in text


def test_timing_the_transforms_does_not_change_their_output(data):
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import torchvision_imagefolder as ex
    finally:
        sys.path.pop(0)
    from core.loader_stages import instrument

    plain, timed = ex.make_dataset(data, image_size=48), ex.make_dataset(data, image_size=48)
    acc: dict[str, float] = {}
    assert instrument(timed, acc)[:2] == ["read", "decode"]
    for i in (0, 5, 11):
        torch.manual_seed(i)
        a = plain[i]
        torch.manual_seed(i)
        b = timed[i]
        assert a[1] == b[1] and torch.equal(a[0], b[0])
    assert all(v > 0 for v in acc.values()), acc


@pytest.mark.parametrize("loader", [TF_DATA, DATAFLOW])
def test_loader_only_runs_the_tf_data_and_dataflow_examples(data, tmp_path, loader):
    js = tmp_path / "loader.json"
    p = start("bench_input.py", "--loader", loader, "--loader-arg", f"data={data}", "--loader-arg", "batch_size=4",
              "--loader-arg", "image_size=32", "--loader-only", "--loader-workers", "1", "--loader-seconds", "2",
              "--json", str(js))  # fmt: skip
    code, text, err = finish(p, 300)
    assert code == 0, err
    doc = json.loads(js.read_text())
    check_figures(doc)
    assert doc["points"][0]["images_per_sec"] > 0
    assert doc["stages"]["stages"] == [] and doc["stages"]["note"] in text
    assert left_in_session(p.pid) == []


# --------------------------------------------------------------------------- in a run: consumer path, capacity


@pytest.mark.parametrize("loader", [f"{TV}:make_loader", TF_DATA, DATAFLOW])
def test_a_loader_feeds_zmq_consume_and_its_capacity_is_found(data, tmp_path, ipc_dir, loader):
    """Each kind of loader as the run's producers; the capacity search (minutes of probes) runs for one of them.
    Nothing is left in the run's TMPDIR: the DataLoader workers stopped with each probe's producers left
    multiprocessing's pymp-* folders there."""
    search = loader == f"{TV}:make_loader"
    js = tmp_path / "run.json"
    how = (
        ["--find-capacity", "--capacity-tries", "0", "--capacity-probes", "2", *QUICK_PROBE_FLAGS]
        if search
        else ["--warmup-steps", "2", "--steps", "8", "--repeats", "1"]
    )
    p = start("bench_input.py", "--fake-location", "zmq-consume", "--loader", loader,
              "--loader-arg", f"data={data}", *how, "--emulate-rate", "100", "--num-gpus", "1",
              "--batch", "4", "--image-size", "32", "--producers", "1", "--json", str(js),
              env={"TMPDIR": ipc_dir})  # fmt: skip
    code, text, err = finish(p, 560)
    assert code == 0, err[-3000:]
    assert os.listdir(ipc_dir) == []
    doc = json.loads(js.read_text())
    r = doc["paths"]["zmq-consume"]
    assert r["input"]["batch_maker"] == {"kind": "loader", "name": f"loader {loader}", "loader": loader, "workers": 1}
    assert r["images_per_sec"]["median"] > 0
    if search:
        assert doc["capacity"]["zmq-consume"]["images_per_sec"] > 0
    assert r["attribution"]["cpu"]["producer_cores"] > 0, "the loader's processes' CPU is measured"
    assert "use zmq-consume" not in r["verdict"]["advice"]
    assert f"loader {loader}" in text
    assert left_in_session(p.pid) == []


def test_a_float_loader_stops_a_run_with_one_line_naming_it(bad):
    p = start("bench_input.py", "--fake-location", "zmq-consume", "--loader", f"{bad}:floats",
              "--emulate-rate", "100", "--num-gpus", "1", "--batch", "2", "--image-size", "8", "--producers", "1",
              "--warmup-steps", "1", "--steps", "2", "--repeats", "1")  # fmt: skip
    code, _, err = finish(p, 300)
    assert code == 2, err[-2000:]
    lines = error_lines(err)
    assert len(lines) == 1 and f"loader {bad}:floats" in lines[0] and "float32" in lines[0], err[-2000:]
    assert left_in_session(p.pid) == []


# --------------------------------------------------------------------------- inside the trainer


def test_a_torch_rank_iterates_the_dataloader_itself(data, tmp_path):
    """--fake-location loader: each rank iterates its own DataLoader (with a worker process); all stop at the end."""
    js = tmp_path / "run.json"
    p = start("bench_input.py", "--framework", "torch", "--fake-location", "loader", "--loader", f"{TV}:make_loader",
              "--loader-arg", f"data={data}", "--loader-arg", "num_workers=1", "--emulate-rate", "200",
              "--num-gpus", "1", "--batch", "4", "--image-size", "32", "--warmup-steps", "2", "--steps", "4",
              "--repeats", "1", "--json", str(js))  # fmt: skip
    code, text, err = finish(p, 300)
    assert code == 0, err[-3000:]
    doc = json.loads(js.read_text())
    assert doc["paths"]["loader"]["images_per_sec"]["median"] > 0
    assert left_in_session(p.pid) == []


@pytest.mark.parametrize("loader", [TF_DATA, f"{TV}:make_loader"])
def test_the_tensorflow_trainer_runs_a_loader_in_its_own_process(data, tmp_path, loader):
    """--fake-location loader: tf.data inside the graph, anything else through from_generator."""
    js = tmp_path / "run.json"
    p = start("bench_input.py", "--fake-location", "loader", "--loader", loader, "--loader-arg", f"data={data}",
              "--emulate-rate", "200", "--num-gpus", "1", "--batch", "4", "--image-size", "32",
              "--warmup-steps", "2", "--steps", "4", "--repeats", "1", "--json", str(js))  # fmt: skip
    code, text, err = finish(p, 300)
    assert code == 0, err[-3000:]
    assert json.loads(js.read_text())["paths"]["loader"]["images_per_sec"]["median"] > 0
    assert "interrupted" not in text + err
    assert left_in_session(p.pid) == []


# --------------------------------------------------------------------------- the verdict's advice fits the case


def _verdict_of(cfg, share: float, producers: dict | None, ips: float, base: float, path: str = "zmq-consume"):
    from consumers import declared
    from profiler.attribution import attribute, sentence
    from profiler.verdict import verdict

    r = {
        "images_per_sec": {"median": ips},
        "telemetry": {"input_wait_share": share, "producers": producers},
        "input": declared.get("tf", path)(cfg).describe(),
    }
    return verdict(path, r, base), r, attribute, sentence


def test_the_verdict_tells_a_loader_run_its_workers_and_an_external_one_its_rate():
    from core.config import BenchConfig

    loader = "examples/torchvision_imagefolder.py:make_loader"
    cfg = BenchConfig(paths=["zmq-consume"], loader=loader, producer_kind="loader", producers=2)
    prod = {"images_per_sec": 310.0, "send_wait_share": 0.02, "send_latency_ms": 1.0, "count": 2}
    v, *_ = _verdict_of(cfg, 0.41, prod, 310, 540)
    assert v["limiting_stage"] == "producer"
    assert f"loader {loader} limits at 155 img/s per worker" in v["advice"]
    # 4 workers' worth: as many workers where the machine has the cores, else the cores it would need.
    assert ("about 4 workers" if (os.cpu_count() or 1) >= 4 else "needs about 4 cores") in v["advice"], v["advice"]
    assert "--loader-only" in v["advice"] and "zmq-consume" not in v["advice"]

    ext = BenchConfig(paths=["zmq-consume"], endpoint="tcp://127.0.0.1:5555")
    v, r, attribute, sentence = _verdict_of(ext, 0.41, None, 310, 540)
    assert "the external producer at tcp://127.0.0.1:5555" in v["advice"] and "540 img/s" in v["advice"]
    assert "use zmq-consume" not in v["advice"]
    # Its CPU is another process's, maybe another host's: not reported as 0.0 cores.
    cores = {"cores": 0.0, "cpu_s": 0.0, "cpu_s_per_step": 0.0}
    r["telemetry"]["cpu"] = {
        "input": {"producers": cores, "receive": {**cores, "cores": 0.2}, "total": {**cores, "cores": 0.2}},
        "threads": {},
        "producers": [],
    }
    a = attribute(r, {"images_per_sec": {"median": 540}})
    assert a["cpu"]["producer_cores"] is None
    assert "producers not measured: external" in sentence("zmq-consume", a)


def test_a_zmq_consume_run_is_never_told_to_use_zmq_consume():
    from core.config import BenchConfig

    for path in ("zmq-consume", "python-queue"):  # the path the advice names, and one it is given to
        v, *_ = _verdict_of(BenchConfig(paths=[path]), 0.41, None, 310, 540, path)
        assert ("use zmq-consume" in v["advice"]) == (path != "zmq-consume"), v["advice"]


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_a_float_loader_inside_the_trainer_is_one_line(bad, framework):
    p = start("bench_input.py", "--framework", framework, "--fake-location", "loader", "--loader", f"{bad}:floats",
              "--emulate-rate", "100", "--num-gpus", "1", "--batch", "2", "--image-size", "8",
              "--warmup-steps", "1", "--steps", "2", "--repeats", "1")  # fmt: skip
    code, _, err = finish(p, 300)
    assert code == 2, err[-2000:]
    lines = error_lines(err)
    assert len(lines) == 1 and f"loader {bad}:floats: batch 1: images are float32" in lines[0], err[-2000:]
    assert left_in_session(p.pid) == []
