"""The profiler: verdicts on constructed telemetry and on real throttled producers, traces, sweeps and their files."""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys

import pytest
from tensorflow.core.framework.step_stats_pb2 import StepStats

from consumers import declared
from core.config import BenchConfig, apply_defaults
from harness.tf.run import run_path
from profiler.sweep import COLUMNS, SweepError, split_args
from profiler.telemetry import exposed_input_us
from profiler.verdict import add_verdicts, level_of, line, verdict

pytestmark = pytest.mark.timeout(180)
PATHS = declared.names("tf")
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def result(share, queue=None, producers=None, ips=100.0, path="python-queue") -> dict:
    return {
        "images_per_sec": {"median": ips},
        "telemetry": {"input_wait_share": share, "queue": queue, "producers": producers},
        "input": declared.get("tf", path)(None).describe(),  # what the path says about itself, as in a run
    }


def prod(ips: float, send_wait_share: float, latency_ms: float = 1.0) -> dict:
    return {"images_per_sec": ips, "send_wait_share": send_wait_share, "send_latency_ms": latency_ms, "count": 2}


# --- the verdict on constructed telemetry --------------------------------------------------------


def test_levels_follow_the_tensorflow_profiler_thresholds():
    assert level_of(0.20) == "HIGHLY input-bound"
    assert level_of(0.199) == "moderately input-bound"
    assert level_of(0.05) == "moderately input-bound"
    assert level_of(0.049) == "not input-bound"
    assert level_of(None) == "not measured"


def test_slow_producers_that_never_wait_to_send_are_the_limit():
    v = verdict("zmq-consume", result(0.41, producers=prod(310, 0.02), ips=310), baseline_ips=540)
    assert v["level"] == "HIGHLY input-bound" and v["limiting_stage"] == "producer"
    assert "41%" in v["evidence"] and "310.0 img/s against 540 img/s" in v["evidence"]
    assert "--producers" in v["advice"]
    assert line("zmq-consume", v).startswith("zmq-consume: HIGHLY input-bound — waits 41% of each step")


def test_producers_blocked_in_send_while_the_step_waits_blame_the_consumer():
    v = verdict("python-queue", result(0.3, producers=prod(800, 0.9, 40)), baseline_ips=2000)
    assert v["limiting_stage"] == "consumer" and "zmq-consume" in v["advice"]


def test_full_queue_and_busy_producers_mean_the_trainer_is_the_limit():
    q = {"capacity": 8, "mean": 7.9, "empty_share": 0.0, "full_share": 0.95}
    v = verdict("python-queue", result(0.01, queue=q, producers=prod(100, 0.8, 70)), baseline_ips=101)
    assert v["level"] == "not input-bound" and v["limiting_stage"] == "trainer"
    assert "full 95%" in v["evidence"] and "the trainer sets the pace" in v["evidence"]


def test_an_empty_queue_alone_names_the_input_when_wait_was_not_traced():
    q = {"capacity": 8, "mean": 0.1, "empty_share": 0.9, "full_share": 0.0}
    v = verdict("python-queue", result(None, queue=q, producers=prod(50, 0.0)), baseline_ips=500)
    assert v["limiting_stage"] == "producer" and "starved" in v["evidence"]


def test_moderate_share_and_baseline_and_untraced_runs():
    results = {
        "gpu": result(0.0, ips=500),
        "cpu": result(0.08, ips=300),
        "python-dataset": {"images_per_sec": {"median": 400}},  # --no-telemetry
    }
    add_verdicts(results)
    assert results["gpu"]["verdict"]["level"] == "not input-bound"
    assert results["gpu"]["verdict"]["limiting_stage"] == "trainer"
    assert results["cpu"]["verdict"]["level"] == "moderately input-bound"
    assert results["python-dataset"]["verdict"]["level"] == "not measured"


def test_exposed_input_time_counts_only_input_running_alone():
    ss = StepStats()
    dev = ss.dev_stats.add(device="/cpu:0")
    for name, start, length in [("dequeue", 0, 100), ("matmul", 20, 30), ("unstage", 90, 20), ("add", 150, 50)]:
        n = dev.node_stats.add(node_name=name, all_start_micros=start)
        n.all_end_rel_micros = length
    exposed, span = exposed_input_us(ss, {"dequeue", "unstage"})
    # input covers 0-110; others 20-50 and 150-200 -> exposed 0-20 and 50-110
    assert (exposed, span) == (80, 200)


def test_a_producers_count_over_a_window_without_time_or_batches_gives_no_rate():
    """The consumer's exact counts per producer over a trainer's window (profiler/telemetry.py `delivered_rows`,
    through profiler/uncertainty.py `window_rate`): a producer with no batch in the window, or a window of no
    (or no finite) time, has no row, so no rate; the others' rates are their batches' images over the window."""
    from types import SimpleNamespace

    from profiler.telemetry import delivered_figures, delivered_rows

    def counts(received: int) -> SimpleNamespace:
        return SimpleNamespace(received=received, extras={"send_latency_ms": 2.0})

    producers = {1: counts(14), 2: counts(5), 3: counts(9)}
    before = {1: 4, 2: 5, 3: 8}  # producer 2 sent nothing in the window
    rows = delivered_rows(producers, before, 32, 2.0)
    assert [(r["producer"], r["images_per_sec"]) for r in rows] == [(1, 160.0), (3, 16.0)]
    for dt in (0.0, -1.0, float("nan"), float("inf")):
        assert delivered_rows(producers, before, 32, dt) == [] and delivered_figures(producers, before, 32, dt) is None


def test_sweep_lists_are_split_from_the_other_flags():
    grid, rest = split_args(["--sweep", "--fake-location", "zmq-consume,gpu", "--num-gpus", "1,2", "--use-fp16",
                             "false,true", "--steps", "3"], PATHS)  # fmt: skip
    assert grid == {"paths": ["gpu", "zmq-consume"], "num_gpus": [1, 2], "use_fp16": [False, True]}
    assert rest == ["--steps", "3", "--sweep"]
    assert split_args(["--batch", "4"], PATHS) == (None, ["--batch", "4"])
    with pytest.raises(SweepError, match="floppy"):
        split_args(["--sweep", "--fake-location", "gpu,floppy"], PATHS)
    with pytest.raises(SweepError, match="--batch"):
        split_args(["--sweep", "--batch", "2,0"], PATHS)


# --- real runs ---------------------------------------------------------------------------------------


def tiny(**kw) -> BenchConfig:
    base = {"batch": 2, "image_size": 32, "num_gpus": 1, "warmup_steps": 2, "steps": 8, "repeats": 2, "producers": 1,
            "input_only": True, "recv_timeout": 30, "telemetry_every": 2}  # fmt: skip
    cfg = BenchConfig(**{**base, **kw})
    apply_defaults(cfg, gpus=0)
    return cfg


@pytest.fixture(scope="module")
def baseline() -> dict:
    return run_path(tiny(), "gpu", has_gpu=False)


def test_on_device_baseline_is_not_input_bound(baseline):
    results = {"gpu": baseline}
    add_verdicts(results)
    assert baseline["telemetry"]["sampled_steps"] >= 4
    assert baseline["verdict"]["level"] == "not input-bound"
    assert baseline["telemetry"]["input_wait_share"] < 0.05


# A Python consumer and the native op: the verdict reads the producers' figures, which both report.
@pytest.mark.parametrize("path", ["python-queue", "zmq-consume"])
def test_producer_throttled_far_below_the_trainer_is_named_the_limit(baseline, path):
    # 20 images/s against thousands with on-device data: unambiguous, whatever the machine's speed.
    # Warm-up takes what the producer queued while the trainer started, so the measured steps see the trickle.
    r = run_path(tiny(producer_rate=20, warmup_steps=12), path, has_gpu=False)
    results = {"gpu": baseline, path: r}
    add_verdicts(results)
    v = r["verdict"]
    assert v["level"] == "HIGHLY input-bound", line(path, v)
    assert v["limiting_stage"] == "producer", line(path, v)
    tel = r["telemetry"]
    assert tel["producers"]["images_per_sec"] < 100
    wire = tel["wire"]
    assert 0 < wire["messages_per_sec"] < 100 / 2
    # Counted, not derived: each message carries 2 images of 32x32x3 and 2 labels, plus a header.
    assert 2 * 32 * 32 * 3 + 8 < wire["bytes_per_sec"] / wire["messages_per_sec"] < 2 * 32 * 32 * 3 + 8 + 1024
    if path == "python-queue":
        assert tel["queue"]["empty_share"] > 0.5 and tel["queue"]["capacity"] == 8
        assert wire["source"] == "consumer counters" and wire["latency_ms_mean"] >= 0
    else:
        assert wire["source"] == "zmq_ops connection counters" and wire["latency_ms_mean"] is None
    assert tel["staging"]["towers"] == 1


def test_no_telemetry_run_reports_no_telemetry():
    r = run_path(tiny(telemetry=False, steps=2, repeats=1), "gpu", has_gpu=False)
    assert "telemetry" not in r


def bench(*args: str, timeout: int = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "bench_input.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_profile_writes_a_tensorboard_trace_and_a_chrome_timeline(tmp_path):
    out = tmp_path / "prof"
    p = bench("--input-only", "--fake-location", "gpu", "--image-size", "32", "--batch", "2", "--warmup-steps", "1",
              "--steps", "5", "--repeats", "1", "--profile", str(out), "--json", str(tmp_path / "r.json"))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"tensorboard --logdir {out}" in p.stdout and "chrome://tracing" in p.stdout
    assert list((out / "gpu" / "plugins" / "profile").glob("*/*.xplane.pb"))
    trace = json.loads((out / "gpu" / "timeline.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    doc = json.loads((tmp_path / "r.json").read_text())
    v = doc["paths"]["gpu"]["verdict"]
    assert set(v) == {"level", "limiting_stage", "evidence", "advice"}
    assert "gpu: not input-bound" in p.stdout


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_sweep_writes_four_files_that_agree(tmp_path):
    out = tmp_path / "results"
    p = bench("--sweep", "--input-only", "--fake-location", "gpu", "--num-gpus", "1,2", "--image-size", "32",
              "--batch", "2", "--warmup-steps", "1", "--steps", "3", "--repeats", "2", "--out", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(f.name for f in out.iterdir()) == ["results.csv", "results.json", "results.md", "results.png"]
    doc = json.loads((out / "results.json").read_text())
    rows = doc["rows"]
    assert [(r["path"], r["num_gpus"]) for r in rows] == [("gpu", 1), ("gpu", 2)]
    with open(out / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == COLUMNS and len(table) == len(rows)
    for j, c in zip(rows, table):
        for k in COLUMNS:
            if isinstance(j[k], float):
                assert float(c[k]) == j[k], k  # the very same numbers, not rounded copies
            elif j[k] is None:
                assert c[k] == ""
            else:
                assert c[k] == str(j[k]), k
    assert rows[0]["scaling_efficiency"] == 1.0
    md = (out / "results.md").read_text()
    assert sum(1 for ln in md.splitlines() if ln.startswith("| `gpu` ")) == 2 and "scaling eff." in md
    assert [r["model"] for r in rows] == ["none (input only)"] * 2 and "ResNet-50" not in md  # nothing trained
    # 13 x (4.5 + 0.9) inches at 100 dpi: one row of plots, the legend and its caption under them.
    assert png_size(out / "results.png") == (1300, 540)
    assert doc["runs"][1]["paths"]["gpu"]["telemetry"]["trainer"]["images_per_sec"] == rows[1]["images_per_sec"]
