"""A TensorFlow cluster on this machine: --local-cluster 2,1 trains, keeps its variables in sync, and stops whole.

Kept light (the input-only model, 32x32 images, one tower per worker, a few
steps): three TensorFlow processes share the machine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from core.errors import ConfigError
from profiler.cluster_report import straggler
from runner.cluster_spec import cluster_config, parse_local_cluster
from tests.conftest import ROOT

TINY = [
    "--input-only", "--num-gpus", "1", "--batch", "4", "--image-size", "32",
    "--producers", "1", "--recv-timeout", "60",
]  # fmt: skip


def bench(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "bench_input.py"), *args]


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def assert_all_gone(procs: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(procs, timeout=10)
    left = [" ".join(p.cmdline()[:6]) for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"still running: {left}"


@pytest.mark.parametrize(
    "path,mode",
    [("zmq-consume", "distributed_replicated"), ("python-queue", "distributed_parameter_server")],
)
def test_local_cluster_trains_with_variables_in_sync(tmp_path, path, mode):
    out = tmp_path / "cluster.json"
    cmd = bench(
        "--local-cluster", "2,1", "--variable-update", mode, "--fake-location", path, *TINY,
        "--warmup-steps", "2", "--steps", "4", "--repeats", "2", "--json", str(out),
    )  # fmt: skip
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[psutil.Process] = []
    while p.poll() is None:
        seen = list({q.pid: q for q in [*seen, *descendants(p.pid)]}.values())
        time.sleep(0.5)
    stdout, stderr = p.communicate()
    assert p.returncode == 0, stderr[-3000:]
    assert "straggler:" in stdout and "total" in stdout

    doc = json.loads(out.read_text())
    r = doc["paths"][path]
    assert r["cluster"]["mode"] == mode
    assert len(r["workers"]) == 2
    assert [w["cluster"]["task_index"] for w in r["workers"]] == [0, 1]
    assert r["loss_finite"] and all(w["loss_finite"] for w in r["workers"])
    assert r["steps_run"] == 2 + 4 * 2 + r["workers"][0]["schedule"]["untimed_steps"]  # + untimed telemetry steps
    assert r["images_per_sec"]["median"] == pytest.approx(sum(w["images_per_sec"]["median"] for w in r["workers"]))
    # Both workers read the same trained values from the parameter server ...
    figures = [w["cluster"]["variables"] for w in r["workers"]]
    assert figures[0]["ps"] == figures[1]["ps"]
    assert figures[0]["sum"] != 1.0  # the input-only model's one weight starts at 1 and was trained
    if mode == "distributed_replicated":
        # ... and, replicated, each worker's own copy equals them after the last step.
        assert all(f["local"] == f["ps"] for f in figures)
    assert r["variables_in_sync"]
    assert all(w["cluster"]["barrier_wait_ms"] >= 0 for w in r["workers"])
    # Each worker pulled from its own producers.
    assert all(sum(row["received"] for row in w["producers"]) > 0 for w in r["workers"])
    assert_all_gone(seen)


def test_killed_worker_stops_the_whole_cluster(tmp_path):
    cmd = bench(
        "--local-cluster", "2,1", "--fake-location", "python-queue", *TINY,
        "--warmup-steps", "2", "--steps", "100000", "--repeats", "1",
    )  # fmt: skip
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim, seen, deadline = None, [], time.monotonic() + 120
        # Wait until worker 1 runs its producer: then the cluster is up and training.
        while victim is None and time.monotonic() < deadline and p.poll() is None:
            seen = list({q.pid: q for q in [*seen, *descendants(p.pid)]}.values())
            for q in seen:
                try:
                    cmdline = q.cmdline()
                except psutil.NoSuchProcess:
                    continue
                if "--task-index" in cmdline and cmdline[cmdline.index("--task-index") + 1] == "1":
                    if any("producers" in " ".join(c.cmdline()) for c in q.children(recursive=True)):
                        victim = q
            time.sleep(0.5)
        assert victim is not None, "worker 1 never started its producer"
        time.sleep(3)  # a few steps in
        seen = list({q.pid: q for q in [*seen, *descendants(p.pid)]}.values())
        victim.send_signal(signal.SIGKILL)
        _, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2
    assert "error: worker 1 exited with signal SIGKILL" in stderr
    assert_all_gone(seen)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--variable-update", "distributed_replicated", "--fake-location", "cpu"], "--job-name worker|ps is needed"),
        (["--local-cluster", "2,1"], "a cluster run trains one input path"),
    ],
)
def test_bad_cluster_flags_get_one_line(args, message):
    r = subprocess.run(bench(*args), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert f"error: {message}" in r.stderr


@pytest.mark.parametrize(
    "job,index,workers,ps,message",
    [
        (
            "worker",
            2,
            "127.0.0.1:5001,127.0.0.1:5002",
            "127.0.0.1:5003",
            "--task-index 2: the worker job has tasks 0 to 1",
        ),
        ("ps", 0, "127.0.0.1:5001", "localhost", "--ps-hosts: 'localhost' is not host:port"),
        ("ps", 0, "127.0.0.1:5001", "127.0.0.1:5001", "--worker-hosts and --ps-hosts share a host:port"),
        ("worker", 0, "h:5001,h:5001", "h:5003", "--worker-hosts: the same host:port appears twice"),
    ],
)
def test_cluster_flags_are_checked_together(job, index, workers, ps, message):
    with pytest.raises(ConfigError) as e:
        cluster_config(job, index, workers, ps)
    assert str(e.value) == message


def test_local_cluster_spec():
    assert parse_local_cluster("3,2") == (3, 2)
    for bad in ("2", "2,0", "a,b", "1,1,1"):
        with pytest.raises(ConfigError, match="--local-cluster"):
            parse_local_cluster(bad)
    cc = cluster_config("worker", 1, "[::1]:5001,[::1]:5002", "[::1]:5003")
    assert not cc.is_chief and cc.flags()[:4] == ["--job-name", "worker", "--task-index", "1"]


def _worker(task: int, barrier_ms: float | None, input_wait: float, rate: float = 100.0) -> dict:
    return {
        "cluster": {"task_index": task, "barrier_wait_ms": barrier_ms},
        "images_per_sec": {"median": rate},
        "step_time_ms": {"p50": 40.0},
        "telemetry": {"input_wait_share": input_wait},
    }


def test_the_straggler_is_the_worker_the_others_wait_for():
    # Worker 1's producers are slow: it reaches the barrier last, so it waits there least.
    s = straggler([_worker(0, 35.0, 0.0), _worker(1, 0.5, 0.87)])
    assert s["worker"] == 1 and "wait for its input 87%" in s["why"]
    # A slow step of its own, not its input.
    s = straggler([_worker(0, 1.0, 0.0), _worker(1, 20.0, 0.0), _worker(2, 22.0, 0.0)])
    assert s["worker"] == 0 and "its own step is the slowest" in s["why"]
    # Everyone arrives together: nobody is named.
    assert straggler([_worker(0, 2.0, 0.0), _worker(1, 3.0, 0.0)])["worker"] is None
