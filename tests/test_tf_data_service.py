"""tf-data-service: a real dispatcher and real workers (processes, gRPC ports on 127.0.0.1), every batch once.

The module starts one service (a dispatcher and two workers) that the runs
address with --dispatcher; the fault tests start the run's own, once each.
"""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest
from conftest import descendants
from tensorpack.callbacks import Callback

from core.config import BenchConfig, apply_defaults
from core.errors import ConfigError, InputError
from harness.tf.run import run_path
from producers.dataset import make_dataset
from runner.data_service import ServiceGroup
from runner.local_cluster import free_ports

pytestmark = pytest.mark.timeout(300)
PATH = "tf-data-service"
ENGINE = "consumers.tf_service"


def small(**kw) -> BenchConfig:
    base = {"batch": 2, "image_size": 32, "num_gpus": 1, "warmup_steps": 2, "steps": 6, "repeats": 2}
    cfg = BenchConfig(**{"input_only": True, "recv_timeout": 60, **base, **kw})
    apply_defaults(cfg, gpus=0)
    return cfg


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
