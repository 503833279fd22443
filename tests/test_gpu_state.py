"""The GPUs' clocks, power and throttling beside each window, read through NVML: here through a fake NVML library
(tests/fake_nvml/fake_nvml.c, built as libnvidia-ml.so.1) whose state the test sets, window by window."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

pytest.importorskip("pynvml")

NORMAL = "1980 2619 650000 61 99 0"  # SM MHz, memory MHz, power mW, C, utilisation %, throttle reason bits
THROTTLED = "1410 2619 700000 88 99 68"  # 0x44: power cap (software) and thermal (hardware)

# Run in a process whose dynamic loader finds the fake library first, as pynvml loads the real one.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from profiler.gpu_state import GpuState
    from profiler.timeline import Timeline
    from profiler.timeline_plot import timeline_png

    state, reads = sys.argv[1], sys.argv[1] + ".reads"

    def sampled() -> int:
        return os.path.getsize(reads) if os.path.exists(reads) else 0

    def after(n: int) -> None:  # until the sampler has read the state n more times: wait for the event
        goal = sampled() + n
        while sampled() < goal:
            time.sleep(0.01)

    spans = []
    gpu = GpuState.open(1)
    with Timeline("trainer", interval=0.5) as timeline, gpu:
        timeline.gauges["gpu"] = gpu.since_last
        for line in sys.argv[2:]:
            open(state + ".new", "w").write(line + "\\n")
            os.replace(state + ".new", state)  # whole: a read between truncate and write finds no GPU
            after(2)  # the second read began after the write
            start = time.perf_counter()
            after(2)
            spans.append((start, time.perf_counter()))
        after(4)  # a timeline row (every 0.5 s) after the last window
    doc = timeline.document()
    png = timeline_png(doc)
    print(json.dumps({"windows": gpu.windows(spans), "timeline": doc, "png": png[:8].hex()}))
    """
)


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory) -> Path:
    """A folder holding the fake libnvidia-ml.so.1, built from its C source."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake NVML library")
    folder = tmp_path_factory.mktemp("nvml")
    src = ROOT / "tests" / "fake_nvml" / "fake_nvml.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(folder / "libnvidia-ml.so.1"), str(src)], check=True)
    return folder


def sample(fake_nvml: Path, tmp_path: Path, *states: str) -> dict:
    state = tmp_path / "state"
    state.write_text(states[0] + "\n")
    env = {"FAKE_NVML_STATE": str(state), "LD_LIBRARY_PATH": str(fake_nvml), "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(state), *states], cwd=ROOT, env={**_base_env(), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.splitlines()[-1])


def _base_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_STATE")}


def test_each_window_gets_its_gpus_medians_and_a_throttled_window_is_named(fake_nvml, tmp_path):
    got = sample(fake_nvml, tmp_path, NORMAL, THROTTLED)
    first, second = got["windows"]
    assert first["samples"] >= 1 and second["samples"] >= 1
    assert (first["sm_mhz"], first["power_w"], first["temp_c"], first["throttle_reasons"]) == (1980, 650.0, 61, [])
    assert (second["sm_mhz"], second["power_w"], second["temp_c"]) == (1410, 700.0, 88)
    assert second["throttle_reasons"] == ["power cap (software)", "thermal (hardware)"]


def test_the_timeline_has_a_gpu_row_with_clocks_and_power(fake_nvml, tmp_path):
    got = sample(fake_nvml, tmp_path, NORMAL)
    doc = got["timeline"]
    assert "gpu" in doc["stages"]
    rows = [r["stages"]["gpu"] for r in doc["samples"] if "sm_mhz" in r["stages"]["gpu"]]
    assert rows and all(r["sm_mhz"] == 1980 and r["power_w"] == 650.0 for r in rows)
    assert got["png"] == "89504e470d0a1a0a"  # a PNG, drawn with the gpu row's columns


def test_a_ratio_whose_windows_ran_at_other_clocks_says_so_beside_it(fake_nvml, tmp_path):
    from profiler.report import add_ratios, table

    base_w, path_w = sample(fake_nvml, tmp_path, NORMAL, THROTTLED)["windows"]

    def result(rates: list[float], windows: list[dict]) -> dict:
        return {
            "images_per_sec": {"median": sorted(rates)[1], "min": min(rates), "max": max(rates), "repeats": rates},
            "images_per_sec_per_device": {"median": sorted(rates)[1], "min": min(rates), "max": max(rates)},
            "step_time_ms": {"p50": 40.0, "p90": 41.0, "p99": 42.0},
            "loss_finite": True,
            "gpu_state": windows,
        }

    results = {"gpu": result([3000, 3010, 2990], [base_w] * 3), "dali": result([2500, 2510, 2490], [path_w] * 3)}
    add_ratios(results)
    rows = {ln.split()[0]: ln for ln in table(results, 1, False).splitlines()[2:4]}
    assert (
        "GPU SM clock 1410 MHz vs the baseline's 1980; throttled in window 1: power cap (software), thermal "
        in (rows["dali"])
    )
    assert "GPU" not in rows["gpu"]


def test_without_an_nvml_library_the_run_says_so_and_samples_nothing(tmp_path):
    p = subprocess.run(
        [sys.executable, "-c", "from profiler.gpu_state import GpuState; print(GpuState.open(1))"],
        cwd=ROOT, env={**_base_env(), "LD_LIBRARY_PATH": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver")
    assert p.returncode == 0, p.stderr
    note, result = p.stdout.splitlines()
    assert note.startswith("note: GPU clocks and power not sampled (NVML: ") and result == "None"
