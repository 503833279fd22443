"""`make gpu-check`: what it can show without a GPU, with TensorFlow's real placer.

On a machine with GPUs, `python -m benchmarks.gpu_check` compares the
placer's devices with the plan; here the same comparison runs on the CPU
towers a machine without a GPU builds, and on an op asked for a GPU that is
not there, which soft placement moves to the host: the check must name it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.gpu_check import ROOT, ratio_table
from core import gpus
from tf_trainer import devices
from tf_trainer.gpu_check import check_path, moved_ops, placed_devices
from tf_trainer.tf_env import tf

tf = tf()


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    if gpus.nvidia_gpus():
        pytest.skip("this machine has NVIDIA GPUs")
    p = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "gpu-check: no NVIDIA GPU on this machine (nvidia-smi -L, /proc/driver/nvidia/gpus): nothing to check"
    ]


@pytest.mark.parametrize("path, update", [("gpu", ("replicated", "cpu")), ("zmq-consume", ("parameter_server", "cpu"))])
def test_the_placer_puts_every_op_where_the_graph_asks(path, update):
    r = check_path(path, 2, update, has_gpu=False)  # towers on /cpu:0 and /cpu:1, as without a GPU
    assert r["checked"] > 1000  # every op of ResNet-50's towers, read back from the placer
    assert r["moved"] == []


def test_an_op_soft_placement_moves_is_named_with_both_devices():
    g = tf.Graph()
    with g.as_default(), tf.device("/gpu:0"):
        tf.identity(tf.compat.v1.Variable(tf.zeros([4], tf.uint8), name="batch"), name="read_batch")
    checked, moved = moved_ops(g, placed_devices(g, devices.session_config(1, has_gpu=False)))
    assert checked == 5
    assert "batch (VariableV2): /device:GPU:0 -> device:CPU:0" in moved
    assert "read_batch (Identity): /device:GPU:0 -> device:CPU:0" in moved


def test_the_ratio_table_has_a_row_per_path_and_a_column_per_trainer():
    table = ratio_table({"gpu": 1.0, "cpu": 0.5}, {"gpu": 1.0, "spdl": 0.91, "dali": None})
    assert table.splitlines() == [
        "| path | TensorFlow | PyTorch |",
        "|---|---|---|",
        "| gpu | 1.00 | 1.00 |",
        "| cpu | 0.50 | - |",
        "| spdl | - | 0.91 |",
        "| dali | - | n/a |",
    ]
