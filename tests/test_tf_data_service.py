"""tf-data-service: a real dispatcher and real workers (processes, gRPC ports on 127.0.0.1), every batch once.

The module starts one service (a dispatcher and two workers) that the runs
address with --dispatcher; the fault tests start the run's own, once each.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time

import jsonschema
import psutil
import pytest
from conftest import descendants
from schema import SCHEMA
from tensorpack.callbacks import Callback

from consumers.tf_data_service.tf import TFDataService
from core.config import BenchConfig, apply_defaults
from core.errors import ConfigError, InputError
from core.loader_spec import LoaderError
from harness.tf.run import run_path
from producers.dataset import make_dataset
from runner.data_service import ServiceGroup
from runner.local_cluster import free_ports
from runner.producer_group import ProducerDied

pytestmark = pytest.mark.timeout(300)
PATH = "tf-data-service"
ENGINE = "consumers.tf_service"


def small(**kw) -> BenchConfig:
    base = {"batch": 2, "image_size": 32, "num_gpus": 1, "warmup_steps": 2, "steps": 6, "repeats": 2}
    cfg = BenchConfig(**{"input_only": True, "recv_timeout": 60, **base, **kw})
    apply_defaults(cfg, gpus=0)
    return cfg


def check_service(service: dict) -> None:
    """A result's `service` against its declared schema (docs/results.schema.json with the path's fields)."""
    schema = {"$defs": SCHEMA["$defs"], **SCHEMA["$defs"]["path_result"]["properties"]["service"]}
    jsonschema.validate(service, schema)


def engine_processes(but: set[int] = frozenset()) -> list[psutil.Process]:
    """This test process's descendants that are tf.data service processes (but those in `but`)."""
    return [p for p in descendants(os.getpid()) if ENGINE in " ".join(_cmdline(p)) and p.pid not in but]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(scope="module")
def service():
    group = ServiceGroup(2).start()
    try:
        group.wait_ready(180)
        yield group
    finally:
        group.stop()
    assert not engine_processes()


def test_off_mode_delivers_each_workers_pass_in_order_without_loss(service):
    # The client learns of the second worker's task at a later refresh (a second, or more on a loaded machine):
    # a run that saw one worker's stream only is run again, up to a bound, until both streams arrived.
    for _ in range(4):
        result = run_path(small(dispatcher=service.address, service_mode="off", warmup_steps=1500), PATH, False)
        rows = result["producers"]
        if len(rows) == 2:
            break
    assert len(rows) == 2  # one stream per worker: each runs the whole source
    assert all(r["lost"] == 0 and r["duplicated"] == 0 and r["restarts"] == 0 and r["joined_at"] == 0 for r in rows)
    assert sum(r["received"] for r in rows) >= 1500 + 6 * 2
    assert result["service"]["dispatcher"] == service.address and not result["service"]["started_here"]
    wire = result["telemetry"]["wire"]
    assert wire["bytes_per_sec"] == pytest.approx(wire["messages_per_sec"] * (2 * 32 * 32 * 3 + 2 * 4 + 16))


def test_dynamic_mode_decodes_the_folder_and_delivers_each_batch_once(service, tmp_path):
    make_dataset(tmp_path / "data", classes=3, per_class=4, seed=1)
    cfg = small(dispatcher=service.address, service_mode="dynamic", producer_kind="decode", data=str(tmp_path / "data"))
    result = run_path(cfg, PATH, False)
    overall = result["service"]["delivered"]
    assert overall["duplicated"] == 0 and overall["missing"] == 0
    assert overall["distinct"] == overall["received"] >= 2 + 6 * 2


TF_DATA = "examples/tf_data_jpeg.py:make_dataset"  # read, decode, crop, flip, batch: TensorFlow ops only

PYTHON_LOADERS = """
import numpy as np
import tensorflow as tf


def _batches(batch_size, image_size):
    while True:
        yield np.zeros((batch_size, image_size, image_size, 3), np.uint8), np.zeros(batch_size, np.int64)


def from_generator(batch_size=2, image_size=8):
    shapes = ((batch_size, image_size, image_size, 3), (batch_size,))
    signature = (tf.TensorSpec(shapes[0], tf.uint8), tf.TensorSpec(shapes[1], tf.int64))
    return tf.data.Dataset.from_generator(lambda: _batches(batch_size, image_size), output_signature=signature)


def py_function(batch_size=2, image_size=8):
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.py_function(lambda x: x * 2, [i], tf.int64))
    return ds.map(lambda i: (tf.zeros((image_size, image_size, 3), tf.uint8), i)).batch(batch_size, True)


def generator(batch_size=2, image_size=8):
    return _batches(batch_size, image_size)


def floats(batch_size=2, image_size=8):
    images = tf.zeros((batch_size, image_size, image_size, 3), tf.float32)
    return tf.data.Dataset.from_tensors((images, tf.zeros(batch_size, tf.int64))).repeat()
"""


def test_a_loader_tf_data_pipeline_runs_in_the_workers_and_each_pass_delivers_every_batch_once(service, tmp_path):
    make_dataset(tmp_path / "data", classes=3, per_class=4, seed=1)
    cfg = small(
        dispatcher=service.address, service_mode="off", producer_kind="loader", loader=TF_DATA,
        loader_arg=[f"data={tmp_path / 'data'}"], warmup_steps=200,
    )  # fmt: skip
    result = run_path(cfg, PATH, False)
    rows = result["producers"]
    assert rows and all(r["lost"] == 0 and r["duplicated"] == 0 and r["restarts"] == 0 for r in rows), rows
    assert sum(r["received"] for r in rows) >= 200 + 6 * 2
    assert "not_checked" not in result["service"]
    assert result["input"]["batch_maker"]["name"].endswith(f", running loader {TF_DATA})")


def test_a_loader_with_dynamic_sharding_is_counted_per_pass_and_says_what_is_not_checked(service, tmp_path):
    make_dataset(tmp_path / "data", classes=3, per_class=4, seed=1)
    cfg = small(
        dispatcher=service.address, service_mode="dynamic", producer_kind="loader", loader=TF_DATA,
        loader_arg=[f"data={tmp_path / 'data'}"],
    )  # fmt: skip
    result = run_path(cfg, PATH, False)
    rows = result["producers"]
    assert rows and all(r["lost"] == 0 and r["duplicated"] == 0 and r["joined_at"] == 0 for r in rows), rows
    assert "delivered" not in result["service"]
    check_service(result["service"])
    assert result["service"]["not_checked"].startswith("each source element handed to one worker only")


NEEDS_PYTHON = (
    "; the tf.data service's workers run the pipeline's graph in processes of their own, without this process's "
    "Python: build it from TensorFlow ops only (tf.io, tf.image, Dataset.map of TensorFlow functions), or run this "
    "loader as producers (--fake-location zmq-consume) or inside the trainer (--fake-location loader)"
)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("from_generator", "its tf.data pipeline calls Python (Dataset.from_generator)" + NEEDS_PYTHON),
        ("py_function", "its tf.data pipeline calls Python (tf.py_function)" + NEEDS_PYTHON),
        ("generator", "it returns an iterable (a generator or the like), not a tf.data.Dataset" + NEEDS_PYTHON),
        (
            "floats",
            "images are float32 (2, 8, 8, 3); the model takes uint8 NHWC: end the pipeline with "
            "tf.cast(tf.clip_by_value(x, 0, 255), tf.uint8)",
        ),
    ],
)
def test_a_loader_the_workers_cannot_run_or_the_model_cannot_take_is_one_line_before_the_service_starts(
    tmp_path, name, why
):
    (tmp_path / "python_loaders.py").write_text(PYTHON_LOADERS)
    loader = f"{tmp_path / 'python_loaders.py'}:{name}"
    others = {p.pid for p in engine_processes()}  # the module's service, if it is up
    with pytest.raises(LoaderError) as e:
        run_path(small(producer_kind="loader", loader=loader, image_size=8), PATH, False)
    assert str(e.value) == f"loader {loader}: {why}"
    assert not engine_processes(others)


def test_the_path_takes_a_loader_and_names_it_among_the_work_its_workers_run():
    from consumers.declared import load

    validate = load("tf")[PATH].validate
    validate(small(producer_kind="loader", loader=TF_DATA))  # its pipeline is checked when it is made
    with pytest.raises(ConfigError) as e:
        validate(small(producer_kind="dali"))
    assert str(e.value) == (
        f"--fake-location {PATH} with --producer-kind dali: its workers run synthetic or decode work "
        "(--producer-kind synthetic|decode), or your --loader's tf.data pipeline"
    )


def test_an_unreachable_dispatcher_is_one_line_naming_it():
    port = free_ports(1)[0]
    cfg = small(dispatcher=f"grpc://127.0.0.1:{port}", recv_timeout=5)
    from consumers.declared import load

    with pytest.raises(ConfigError) as e:
        load("tf")[PATH].validate(cfg)
    assert re.fullmatch(
        rf"--dispatcher grpc://127.0.0.1:{port}: no tf.data service dispatcher reachable there \(.+ within 5 s\)",
        str(e.value),
    ), str(e.value)


class _KillWorker(Callback):
    """Kills the run's service worker 1 with SIGKILL at step `at` (the run's own service, started by the path)."""

    def __init__(self, at: int, but: set[int]) -> None:
        self.at, self.step, self.but = at, 0, but

    def _trigger_step(self) -> None:
        self.step += 1
        if self.step == self.at:
            worker = next(
                p for p in engine_processes(self.but) if "worker" in _cmdline(p) and "--dispatcher" in _cmdline(p)
            )
            ports = [c for c in _cmdline(worker) if c.isdigit()]
            self.killed = ports[0]
            worker.kill()


def test_a_worker_killed_mid_run_stops_the_run_in_one_line_naming_it_and_leaves_nothing():
    others = {p.pid for p in engine_processes()}  # the module's service, if it is up
    kill = _KillWorker(3, others)
    cfg = small(service_workers=1, steps=200, repeats=1)
    with pytest.raises(InputError) as e:
        run_path(cfg, PATH, False, extra_callbacks=[kill])
    line = str(e.value)
    assert re.fullmatch(rf"{PATH}: service worker \d \(127\.0\.0\.1:{kill.killed}\) exited, killed by SIGKILL", line), (
        line
    )
    assert not engine_processes(others)


def test_sigterm_while_the_service_runs_leaves_no_engine_process(procs, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = procs.start(
        "bench_input.py", "--fake-location", PATH, "--num-gpus", "1", "--batch", "2", "--image-size", "32",
        "--input-only", "--steps", "2", "--repeats", "1", env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while len([p for p in descendants(run.pid) if ENGINE in " ".join(_cmdline(p))]) < 3:
        assert run.poll() is None, run.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    engine = [p for p in descendants(run.pid) if ENGINE in " ".join(_cmdline(p))]
    run.send_signal(signal.SIGTERM)
    assert run.wait(60) != 0
    gone, alive = psutil.wait_procs(engine, timeout=10)
    assert not alive
    assert not os.listdir(tmp)


def test_a_service_without_workers_ends_the_run_within_the_receive_timeout_in_one_line():
    lone = ServiceGroup(0).start()  # a dispatcher that no worker ever joins: the client would wait for ever
    try:
        lone.wait_ready(180)
        with pytest.raises(InputError) as e:
            run_path(small(dispatcher=lone.address, recv_timeout=3), PATH, False)
    finally:
        lone.stop()
    assert str(e.value) == f"{PATH}: no batch from the tf.data service at {lone.address} within 3 s"


def test_with_continue_the_run_goes_on_while_a_worker_is_left_and_stops_naming_one_when_none_is():
    others = {p.pid for p in engine_processes()}  # the module's service, if it is up
    group = ServiceGroup(2, on_exit="continue").start()  # its processes need not be up: only their exits count
    try:
        for i in (1, 2):  # process 0 is the dispatcher
            group.procs[i].kill()
            group.procs[i].wait()
            if i == 1:
                group.check()  # one worker left: no failure
        with pytest.raises(ProducerDied) as e:
            group.check()
    finally:
        group.stop()
    assert str(e.value) == f"service worker 0 ({group.workers[0]}) exited, killed by SIGKILL"
    assert not engine_processes(others)


class _KillWhenBothDeliver(Callback):
    """SIGKILLs the run's service worker 1 once the client has had batches from both workers' passes, and waits
    until it is gone. Until then each step is paced, so the run's steps last until the client's task refresh
    (about a second) has found both workers, however loaded the machine."""

    def __init__(self) -> None:
        self.killed: str | None = None

    def _before_train(self) -> None:
        self.path = next(
            cb.path for cb in self.trainer._callbacks.cbs if isinstance(getattr(cb, "path", None), TFDataService)
        )

    def _trigger_step(self) -> None:
        tracker = self.path.tracker
        if self.killed is not None:
            return
        if len(tracker.producers) < 2:
            time.sleep(0.01)
            return
        self.received_then = {sid: c.received for sid, c in tracker.producers.items()}
        worker = self.path.service.procs[2]  # process 0 is the dispatcher
        self.killed = self.path.service.workers[1]
        worker.kill()
        worker.wait()


def test_continue_trains_on_when_a_worker_is_killed_mid_run_and_counts_what_was_lost(capfd, tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    others = {p.pid for p in engine_processes()}  # the module's service, if it is up
    kill = _KillWhenBothDeliver()
    cfg = small(service_mode="dynamic", on_producer_exit="continue", warmup_steps=2000, steps=50, repeats=2)
    result = run_path(cfg, PATH, False, extra_callbacks=[kill])  # the run goes on to its last step
    out, _ = capfd.readouterr()
    line = f"service worker 1 ({kill.killed}) exited, killed by SIGKILL"
    assert [ln for ln in out.splitlines() if "warning" in ln] == [
        f"  warning: {line}; continuing with the other workers"
    ]
    service = result["service"]
    check_service(service)
    assert service["exited"] == [line]
    (dead,) = service["streams_ended"]
    rows = {r["producer"]: r for r in result["producers"]}
    live = next(sid for sid in rows if sid != dead)
    assert rows[live]["received"] > kill.received_then[live] + 50  # the other worker's went on
    # What the killed worker had taken from the dispatcher and never delivered: each seq below the live pass's
    # latest that never came.
    tracker = kill.path.tracker
    frontier = tracker.latest[live]
    delivered = service["delivered"]
    assert delivered["missing"] == frontier + 1 - sum(1 for s in tracker.seen if s <= frontier)
    assert delivered["duplicated"] == 0 and delivered["received"] == delivered["distinct"]
    assert not engine_processes(others)
    assert not os.listdir(tmp)
