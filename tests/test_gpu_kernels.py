"""Every op a run puts on a GPU has a GPU kernel for its types, asked of TensorFlow's own kernel registry.

The trainer's session allows soft placement, so an op on `/gpu:k` without a
GPU kernel would not fail on a GPU machine: TensorFlow would quietly run it
on the host and copy its inputs across every step (the baseline's uint8
batch variable once did exactly that). Graphs are built as a machine with 2
or 4 GPUs builds them (`build(..., has_gpu=True)`), without running them,
for every path, variable update and model. The registry answers without a
GPU, but only in the CUDA build of TensorFlow (the `tensorflow` wheel, which
`make install` installs); under `tensorflow-cpu` the module is skipped.
"""

from __future__ import annotations

import pytest
from path_lists import default_paths

from consumers import declared
from core.config import BenchConfig, apply_defaults
from frameworks.tf_env import import_tf
from harness.tf.kernels import gpu_device, missing_gpu_kernels, registry_has_gpu_kernels
from harness.tf.run import build

tf = import_tf()
declared.load("tf")

if not registry_has_gpu_kernels():
    pytest.skip(
        "tensorflow-cpu is installed: it registers no GPU kernels to check against "
        "(the `tensorflow` wheel does, on any machine; `make install` installs it)",
        allow_module_level=True,
    )

PATHS = default_paths("tf")
UPDATES = [("replicated", "cpu"), ("parameter_server", "cpu"), ("parameter_server", "gpu")]
MODELS = {
    "input-only": {"input_only": True},
    "resnet50": {},
    "emulated": {"model": "emulated", "emulate_rate": 1000.0},
}


def make(path: str, n: int, update: tuple[str, str], model: str):
    cfg = BenchConfig(
        paths=[path],
        num_gpus=n,
        batch=2,
        image_size=32,
        variable_update=update[0],
        ps_device=update[1],
        **MODELS[model],
    )
    apply_defaults(cfg, n)
    return build(cfg, path, n, has_gpu=True, endpoint="ipc:///tmp/feedbench-kernels-not-bound")


# ResNet-50 (seconds per graph, a second per tower) at 2 GPUs only: its 4-GPU graph holds the same op types
# and dtypes, the all-reduce the same NCCL ops with more devices. The quick graphs at both.
MODEL_GPUS = [(model, n) for model in MODELS for n in ([2] if model == "resnet50" else [2, 4])]


@pytest.mark.parametrize("model, n", MODEL_GPUS, ids=[f"{m}-{n}" for m, n in MODEL_GPUS])
@pytest.mark.parametrize("update", UPDATES, ids=["replicated", "ps-cpu", "ps-gpu"])
@pytest.mark.parametrize("path", PATHS)
def test_every_op_on_a_gpu_has_a_gpu_kernel(path, update, model, n):
    g = make(path, n, update, model).graph
    on_gpu = [op for op in g.get_operations() if gpu_device(g, op)]
    # Not vacuous: each tower's model and its batch are on its GPU.
    assert {gpu_device(g, op) for op in on_gpu} == {f"/device:GPU:{k}" for k in range(n)}
    missing = missing_gpu_kernels(g)
    assert not missing, f"{len(missing)} of {len(on_gpu)} ops on a GPU have no GPU kernel:\n" + "\n".join(missing)


def test_a_uint8_variable_on_a_gpu_is_reported_with_its_type():
    """The check itself: the baseline's old uint8 batch variable is named, with its type and device."""
    g = tf.Graph()
    with g.as_default(), tf.device("/gpu:1"):
        v = tf.compat.v1.Variable(tf.zeros([4], tf.uint8), name="batch")
        tf.identity(v)
    missing = missing_gpu_kernels(g)
    assert missing == ["batch (VariableV2 on /device:GPU:1): dtype=uint8"]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> str:
    from producers.dataset import make_dataset

    root = tmp_path_factory.mktemp("jpegs")
    make_dataset(root, 2, 4)
    return str(root)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dali_device", ["cpu", "gpu"])
@pytest.mark.parametrize("update", UPDATES, ids=["replicated", "ps-cpu", "ps-gpu"])
def test_dali_ops_on_a_gpu_have_gpu_kernels(jpegs, update, dali_device, n):
    pytest.importorskip("nvidia.dali.plugin.tf", reason="DALI's TensorFlow plugin is not installed")
    cfg = BenchConfig(
        paths=["dali"], num_gpus=n, batch=2, image_size=32, input_only=True, data=jpegs, dali_device=dali_device
    )
    cfg.variable_update, cfg.ps_device = update
    apply_defaults(cfg, n)
    try:
        g = build(cfg, "dali", n, has_gpu=True, endpoint="ipc:///tmp/feedbench-kernels-not-bound").graph
    except RuntimeError as e:
        if dali_device == "gpu" and any(w in str(e) for w in ("CUDA", "GPU", "pipeline")):
            pytest.skip("DALI cannot make a GPU pipeline without CUDA on this machine")
        raise
    missing = missing_gpu_kernels(g)
    assert not missing, "\n".join(missing)


# Arguments a GPU kernel keeps in host memory by design: shapes, axes and sizes, a few int32 values each.
METADATA_ARGS = {"shape", "dims", "reduction_indices", "axis", "perm", "begin", "end", "size", "strides", "multiples"}


def host_memory_data_args(graph) -> list[str]:
    """Ops on a GPU whose kernel (for their types) keeps a data argument in host memory: a round trip per step."""
    from tensorflow.python.framework import kernels as registered

    found = []
    for op in graph.get_operations():
        device = gpu_device(graph, op)
        if device is None:
            continue
        types = {k: v.type for k, v in op.node_def.attr.items() if v.WhichOneof("value") == "type"}
        for kernel in registered.get_registered_kernels_for_op(op.type).kernel:
            fits = all(c.name not in types or types[c.name] in c.allowed_values.list.type for c in kernel.constraint)
            if kernel.device_type == "GPU" and fits:
                data = sorted(set(kernel.host_memory_arg) - METADATA_ARGS)
                if data:
                    found.append(f"{op.name} ({op.type} on {device}): {', '.join(data)} in host memory")
                break
    return found


@pytest.mark.parametrize("update", UPDATES, ids=["replicated", "ps-cpu", "ps-gpu"])
# Labels made on the GPU (the baseline) and labels fed from the host (zmq-consume).
@pytest.mark.parametrize("path", ["gpu", "zmq-consume"])
def test_the_emulated_models_labels_stay_on_the_gpu(path, update):
    """int32 reductions on a GPU have kernels, but on host memory: the labels would go to the host every step."""
    g = make(path, 2, update, "emulated").graph
    assert host_memory_data_args(g) == []
