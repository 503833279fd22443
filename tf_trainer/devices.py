"""Which devices the towers run on, and how to describe the machine in a report."""

from __future__ import annotations

import os
import platform

from tf_trainer.tf_env import tf


def gpu_count() -> int:
    return len(tf().config.list_physical_devices("GPU"))


def describe() -> dict:
    """The machine a result was measured on, for the JSON report."""
    t = tf()
    gpus = t.config.list_physical_devices("GPU")
    names = []
    for g in gpus:
        try:
            names.append(t.config.experimental.get_device_details(g).get("device_name", g.name))
        except Exception:
            names.append(g.name)
    return {
        "gpus": names,
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "tensorflow": t.__version__,
        "python": platform.python_version(),
    }


def session_config(num_towers: int, has_gpu: bool):
    """Soft placement, and without a GPU one virtual CPU device per tower.

    Unstaging blocks an inter-op thread until its batch arrives; with as
    few threads as cores (2 here) two towers' unstage ops could hold every
    thread while the ops that would feed them wait, so leave room.
    """
    t = tf()
    cfg = t.compat.v1.ConfigProto(allow_soft_placement=True)
    cfg.inter_op_parallelism_threads = max(8, 4 * num_towers)
    if not has_gpu:
        cfg.device_count["CPU"] = max(1, num_towers)
    else:
        cfg.gpu_options.allow_growth = True
    return cfg


def map_towers_to_cpus(graph, num_towers: int) -> int:
    """Without a GPU, move ops that tensorpack pinned to /gpu:k onto /cpu:k.

    tensorpack's multi-GPU builders name tower devices /gpu:k; on a machine
    without one, soft placement would put every tower on /cpu:0. Mapping them
    to one virtual CPU device per tower keeps the towers apart, so the
    multi-device code paths (per-tower input, replication, all-reduce) run
    for real. Returns how many ops were moved.
    """
    moved = 0
    for op in graph.get_operations():
        dev = op.device
        if "GPU:" in dev.upper():
            spec = tf().DeviceSpec.from_string(dev)
            if spec.device_type and spec.device_type.upper() == "GPU":
                op._set_device(spec.replace(device_type="CPU", device_index=(spec.device_index or 0) % num_towers))
                moved += 1
    return moved
