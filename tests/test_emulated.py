"""The emulated device, capacity search and gap attribution, with real producers and real sockets."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import QUICK_PROBES

from core.config import BASELINE, BenchConfig, apply_defaults
from core.emulate import PRESETS, EmulateError, Emulation
from harness.tf.run import run_path
from profiler.attribution import add_attribution, sentence
from runner.capacity import find_capacities

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parent.parent


def emulated(rate: float, **kw) -> BenchConfig:
    cfg = BenchConfig(model="emulated", emulate_rate=rate, num_gpus=2, image_size=32, **kw)
    apply_defaults(cfg, gpus=0)
    return cfg


def test_presets_cite_a_source_and_bad_names_are_one_line() -> None:
    assert {"A100", "H100", "H200"} <= set(PRESETS)
    assert all(p.source and p.images_per_sec > 0 for p in PRESETS.values())
    assert Emulation.of("h100", None).device == "H100"
    with pytest.raises(EmulateError, match="--emulate TPU: unknown device; known: A100, H100, H200"):
        Emulation.of("TPU", None)
    with pytest.raises(EmulateError, match="--emulate-rate -5 must be more than 0"):
        Emulation.of(None, -5)


@pytest.mark.timing
def test_emulated_baseline_reaches_the_set_rate() -> None:
    """On-device data, no input to wait for: the emulated devices set the pace, within 2%."""
    # 100 ms steps, the median of five windows: the trainer's own time between steps stays small
    # against a step even while other work shares the machine.
    cfg = emulated(2000.0, batch=200, steps=12, repeats=5)
    r = run_path(cfg, BASELINE, has_gpu=False)
    set_rate = 2000.0 * cfg.num_gpus
    got = r["images_per_sec"]["median"]
    assert abs(got / set_rate - 1) < 0.02, (got, set_rate)
    assert r["emulated"] == {
        "emulated": True,
        "device": "custom",
        "images_per_sec": 2000.0,
        "source": "--emulate-rate 2000",
    }
    assert r["loss_finite"]


@pytest.mark.timing
def test_capacity_of_a_throttled_producer_is_the_throttle() -> None:
    """Two producers capped at 150 img/s each: the path sustains about 300 img/s while the devices want 500."""
    # Three probes: over the throttle, just under what it delivered, and between; then one more try at each
    # end of the bracket (an interval to check, in half the tries of make bench's). Probes warm up for 1 s
    # (the producers' queues are full well before) and time 1 s: a throttle holds its rate from the start.
    cfg = emulated(
        250.0, paths=[BASELINE, "zmq-consume"], producers=2, producer_rate=150.0, capacity_probes=3, **QUICK_PROBES
    )
    results, _ = find_capacities(
        cfg, lambda c, path: run_path(c, path, has_gpu=False), batch_given=False, log=lambda s: None, confirm=1
    )
    cap = results["zmq-consume"]["capacity"]
    assert cap["images_per_sec"] == pytest.approx(300.0, rel=0.10), cap["probes"]
    lo, hi = cap["interval"]
    assert lo <= 300.0 * 1.05 and (hi is None or hi >= 300.0 * 0.95), cap  # the throttle inside its interval
    assert cap["device"] == "custom" and len(cap["probes"]) >= 2
    assert any(not p["kept_up"] for p in cap["probes"]) and any(p["kept_up"] for p in cap["probes"])


@pytest.mark.timing
def test_a_producer_below_the_demand_makes_the_gap_waiting() -> None:
    cfg = emulated(400.0, producers=1, producer_rate=300.0, steps=16, repeats=2)
    results = {path: run_path(cfg, path, has_gpu=False) for path in (BASELINE, "zmq-consume")}
    add_attribution(results)
    a = results["zmq-consume"]["attribution"]
    assert a["gap"] > 0.3  # 300 of 800 img/s
    assert a["waiting"] + a["slower_steps"] == pytest.approx(a["gap"])
    assert a["waiting"] > 0.8 * a["gap"], a
    words = sentence("zmq-consume", a)
    assert "below the baseline" in words and "waiting for input" in words and "producers" in words


@pytest.mark.timing
def test_a_cpu_hungry_loader_with_ample_rate_makes_the_gap_slower_steps() -> None:
    """Producers that keep ahead but spin while waiting for room (and burn CPU per batch) take cores from
    the CPU-bound ResNet-50 steps: the gap is contention, not waiting."""
    cfg = BenchConfig(num_gpus=1, image_size=32, batch=4, warmup_steps=2, steps=6, repeats=2, producers=8)
    apply_defaults(cfg, gpus=0)
    hungry = replace(cfg, producer_busy_wait=True, producer_cpu_ms=20.0)
    results = {BASELINE: run_path(cfg, BASELINE, has_gpu=False), "zmq-consume": run_path(hungry, "zmq-consume", False)}
    add_attribution(results)
    a = results["zmq-consume"]["attribution"]
    assert a["gap"] > 0.15, a
    assert a["slower_steps"] > 2 * a["waiting"], a
    assert a["cpu"]["producer_cores"] > 0.3, a["cpu"]
    assert a["waiting"] + a["slower_steps"] == pytest.approx(a["gap"])
    assert "slower steps while the input used" in sentence("zmq-consume", a)


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "bench_input.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_a_sweep_over_emulated_rates_labels_every_row(tmp_path) -> None:
    out = tmp_path / "results"
    p = bench("--sweep", "--emulate-rate", "500,1000", "--fake-location", "gpu", "--image-size", "32",
              "--warmup-steps", "2", "--steps", "4", "--repeats", "1", "--out", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["model"], r["emulated_images_per_sec_per_device"]) for r in rows] == [
        ("emulated custom", 500.0),
        ("emulated custom", 1000.0),
    ]
    assert "emulated custom (500 img/s per device)" in (out / "results.md").read_text()


def test_an_unknown_preset_is_one_clear_line() -> None:
    p = bench("--emulate", "TPU9")
    assert p.returncode == 2
    last = p.stderr.strip().splitlines()[-1]
    assert last == "error: --emulate TPU9: unknown device; known: A100, H100, H200 (or give --emulate-rate N)"
