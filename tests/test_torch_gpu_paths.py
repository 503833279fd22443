"""What the PyTorch trainer does for GPUs, checked where it can be without one: the self-check's answer on a
machine without a GPU, the defaults it picks for CUDA (channels-last with float16, DALI threads, DALI on the
GPU each rank or tower feeds), the emulated device's label, and the step's constants made once per device."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu_check runs for real")
def test_gpu_check_without_a_gpu_says_so_in_one_line_and_succeeds():
    p = subprocess.run([sys.executable, "-m", "harness.torch.gpu_check"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines() == ["gpu-check (PyTorch): no CUDA GPU on this machine; nothing to check"]


def test_channels_last_is_the_default_on_cuda_with_float16_and_the_run_says_why_not_otherwise():
    from core.config import BenchConfig
    from harness.torch.plugin import channels_last_default

    half = BenchConfig(use_fp16=True)
    assert "NHWC" in channels_last_default(half, gpus=1) and half.data_format == "NHWC"
    asked = BenchConfig(use_fp16=True, data_format="NCHW")
    assert "as asked" in channels_last_default(asked, gpus=1) and asked.data_format == "NCHW"
    full = BenchConfig()
    assert "NCHW" in channels_last_default(full, gpus=1) and full.data_format is None  # apply_defaults: NCHW
    cpu = BenchConfig(use_fp16=True)
    assert channels_last_default(cpu, gpus=0) is None and cpu.data_format is None


def test_dali_threads_default_to_the_cores_per_device_and_at_most_four_for_gpu_decoding():
    from core.config import BenchConfig, apply_defaults

    cores = os.cpu_count() or 1
    on_gpu = BenchConfig(num_gpus=1)
    apply_defaults(on_gpu, gpus=1)
    assert on_gpu.dali_device == "gpu" and on_gpu.dali_threads == min(4, cores)
    on_cpu = BenchConfig(num_gpus=1)
    apply_defaults(on_cpu, gpus=0)
    assert on_cpu.dali_device == "cpu" and on_cpu.dali_threads == cores
    given = BenchConfig(num_gpus=1, dali_threads=3)
    apply_defaults(given, gpus=1)
    assert given.dali_threads == 3


def test_dali_producers_decode_on_the_gpu_they_feed():
    from core.config import BenchConfig
    from runner.producer_group import run_producer_command

    cfg = BenchConfig(producer_kind="dali", dali_device="gpu", data="/data", dali_threads=4, num_gpus=8)
    cmd = run_producer_command(cfg, "ipc:///tmp/x", 3000, "/tmp/s.json", device_id=3)
    assert cmd[cmd.index("--device-id") + 1] == "3" and cmd[cmd.index("--dali-device") + 1] == "gpu"
    cfg.dali_device = "cpu"
    assert "--device-id" not in run_producer_command(cfg, "ipc:///tmp/x", 0, "/tmp/s.json", device_id=3)


def test_normalize_makes_its_constants_once_per_device():
    from models.torch import _stats, normalize

    x = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
    normalize(x, True)
    first = _stats(torch.device("cpu"))
    normalize(x, False)
    assert _stats(torch.device("cpu"))[0] is first[0]


def test_an_emulated_device_is_labelled_in_the_header(procs):
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--fake-location", "gpu", "--emulate", "H100", "--num-gpus", "1",
        "--batch", "8", "--image-size", "32", "--warmup-steps", "1", "--steps", "2", "--repeats", "1",
    )  # fmt: skip
    out, err = run.communicate(timeout=240)
    assert run.returncode == 0, err
    header = [ln for ln in out.splitlines() if ln.startswith("feedbench (PyTorch")][0]
    assert "emulated H100" in header and "img/s per device" in header and "[source:" in header, header
    assert header.startswith("feedbench (PyTorch") and ": emulated H100 (" in header, header
