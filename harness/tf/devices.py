"""Which devices the towers run on, and how to describe the machine in a report."""

from __future__ import annotations

from core import gpus as nvidia
from core.errors import ConfigError
from core.machine import host_fields
from frameworks.tf_env import import_tf

# How to get the TensorFlow that can use this machine's GPUs (scripts/setup_env.sh, docs/gpu.md).
TF_FIX = "run `make install`, which installs the `tensorflow` wheel with CUDA 12 (docs/gpu.md)"


def cuda_build() -> str | None:
    """The CUDA version this TensorFlow was built with ("12.5.1"), None for tensorflow-cpu."""
    t = import_tf()
    if not t.test.is_built_with_cuda():
        return None
    return str(t.sysconfig.get_build_info().get("cuda_version") or "12")


def gpu_count() -> int:
    """The GPUs TensorFlow sees; a ConfigError when the machine has NVIDIA GPUs and it sees none.

    Never a silent run on the host of a GPU machine: the error names the cause
    (a CPU-only wheel, a driver too old for the wheel's CUDA, CUDA libraries
    that did not load) and the fix. CUDA_VISIBLE_DEVICES="" (or -1) hides the
    GPUs on purpose: the run says so and uses the CPU.
    """
    n = len(import_tf().config.list_physical_devices("GPU"))
    problem = nvidia.unseen_gpus("TensorFlow", n, cuda_build(), TF_FIX)
    if problem:
        raise ConfigError(problem)
    if n == 0 and (hidden := nvidia.hidden_by_env()) and nvidia.nvidia_gpus():
        print(f"note: {hidden} hides this machine's NVIDIA GPUs: the towers run on the CPU", flush=True)
    return n


def describe() -> dict:
    """The machine a result was measured on, for the JSON report."""
    t = import_tf()
    gpus = t.config.list_physical_devices("GPU")
    names = []
    for g in gpus:
        try:
            names.append(t.config.experimental.get_device_details(g).get("device_name", g.name))
        except Exception:
            names.append(g.name)
    return {"gpus": names, **host_fields(), "tensorflow": t.__version__}


def session_config(num_towers: int, has_gpu: bool):
    """Soft placement, and without a GPU one virtual CPU device per tower.

    Unstaging blocks an inter-op thread until its batch arrives; with as
    few threads as cores (2 here) two towers' unstage ops could hold every
    thread while the ops that would feed them wait, so leave room.
    """
    t = import_tf()
    cfg = t.compat.v1.ConfigProto(allow_soft_placement=True)
    threads = max(8, 4 * num_towers)
    cfg.inter_op_parallelism_threads = threads
    # A named pool of its own: TensorFlow's process-wide inter-op pool is sized by whichever session came
    # first (a default one has as many threads as cores), and then ignores this session's setting.
    pool = cfg.session_inter_op_thread_pool.add()
    pool.num_threads = threads
    pool.global_name = f"feedbench-inter-op-{threads}"
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
            spec = import_tf().DeviceSpec.from_string(dev)
            if spec.device_type and spec.device_type.upper() == "GPU":
                op._set_device(spec.replace(device_type="CPU", device_index=(spec.device_index or 0) % num_towers))
                moved += 1
    return moved
