"""No silent fallback to the host: a machine with NVIDIA GPUs whose TensorFlow sees none stops with the cause.

The machine's GPUs are reported by the driver's own tool, `nvidia-smi`; here
an `nvidia-smi` put first on PATH reports two H100s (what the driver would
say), so the check runs for real on a machine without any: bench_input.py
starts, asks TensorFlow, and must stop before anything runs. Which cause it
names depends on the TensorFlow installed: tensorflow-cpu is a CPU-only
build; the CUDA build finds the reported driver too old, or no libcuda.
"""

from __future__ import annotations

import logging
import os
import stat

import pytest

from core import gpus
from frameworks.tf_env import import_tf
from harness.tf import devices, kernels
from harness.tf.run import QUIET, warn_soft_placement

tf = import_tf()

SMI = """#!/bin/sh
case "$1" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)";;
  --query-gpu=driver_version) echo "{driver}"; echo "{driver}";;
  *) exit 6;;
esac
"""


@pytest.fixture
def gpu_machine(tmp_path, monkeypatch):
    """PATH with an nvidia-smi that reports two GPUs and driver `driver` (call it with the version)."""
    if gpus.nvidia_gpus() and devices.gpu_count():
        pytest.skip("this machine has GPUs that TensorFlow sees")

    def make(driver: str) -> dict:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        smi = bin_dir / "nvidia-smi"
        smi.write_text(SMI.format(driver=driver))
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
        path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        monkeypatch.setenv("PATH", path)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return {**os.environ, "PATH": path}

    return make


def expected_cause(driver: str) -> str:
    if not tf.test.is_built_with_cuda():
        return "TensorFlow here is a CPU-only build; " + devices.TF_FIX
    if driver.startswith("470."):
        return f"NVIDIA driver 470.82.1 is too old for TensorFlow's CUDA {devices.cuda_build()} build (it needs 525.60.13 or newer); update the driver"
    return "the driver's libcuda.so.1 does not load ("


@pytest.mark.parametrize("driver", ["470.82.01", "550.54.14"])
def test_a_gpu_machine_whose_tensorflow_sees_no_gpu_stops_with_one_line_naming_the_cause(procs, gpu_machine, driver):
    env = gpu_machine(driver)
    p = procs.start("bench_input.py", "--fake-location", "gpu", "--steps", "1", "--repeats", "1", env=env)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2, (out, err)
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1, err
    head = "error: this machine has 2 NVIDIA GPU(s) but TensorFlow sees none: "
    assert errors[0].startswith(head + expected_cause(driver)), errors[0]
    assert "images/s" not in out  # nothing ran


def test_gpus_hidden_on_purpose_run_on_the_cpu_and_say_so(gpu_machine, monkeypatch, capsys):
    gpu_machine("550.54.14")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.gpu_count() == 0
    assert "note: CUDA_VISIBLE_DEVICES='' hides this machine's NVIDIA GPUs" in capsys.readouterr().out


def test_without_nvidia_gpus_nothing_is_wrong():
    if gpus.nvidia_gpus():
        pytest.skip("this machine has NVIDIA GPUs")
    assert gpus.unseen_gpus("TensorFlow", 0, None, "fix") is None
    assert gpus.unseen_gpus("torch", 0, "13.0", "fix") is None


def test_tensorpack_placement_messages_get_through_when_there_are_gpus():
    record = logging.LogRecord("tensorpack", logging.WARNING, __file__, 1, "op moved off GPU:0", None, None)
    was = QUIET.has_gpu
    try:
        QUIET.has_gpu = False
        assert not QUIET.filter(record)  # towers on the CPU are intended: the GPU warning misleads
        QUIET.has_gpu = True
        assert QUIET.filter(record)
    finally:
        QUIET.has_gpu = was


def test_soft_placement_moves_are_named(capsys):
    if not kernels.registry_has_gpu_kernels():
        pytest.skip("tensorflow-cpu: no GPU kernel registry to ask (the `tensorflow` wheel has one)")
    g = tf.Graph()
    with g.as_default(), tf.device("/gpu:0"):
        tf.identity(tf.compat.v1.Variable(tf.zeros([4], tf.int32), name="labels"))
    assert warn_soft_placement(g) == [
        "labels (VariableV2 on /device:GPU:0): dtype=int32",
        "labels/Assign (Assign on /device:GPU:0): T=int32",
    ]
    assert "soft placement moves 2 op(s) from their GPU to the host (no GPU kernel): labels (VariableV2" in (
        capsys.readouterr().out
    )


def test_a_gpu_machine_whose_torch_sees_no_gpu_stops_with_one_line_naming_the_cause(procs, gpu_machine):
    """The PyTorch trainer asks the same question of torch before it starts any rank."""
    import torch

    env = gpu_machine("470.82.01")
    p = procs.start("bench_input.py", "--framework", "torch", "--fake-location", "gpu", "--steps", "1", env=env)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2, (out, err)
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1, err
    cause = (
        f"NVIDIA driver 470.82.1 is too old for torch's CUDA {torch.version.cuda} build"
        if torch.version.cuda
        else "torch here is a CPU-only build"
    )
    assert errors[0].startswith("error: this machine has 2 NVIDIA GPU(s) but torch sees none: " + cause), errors[0]
    assert "images/s" not in out
