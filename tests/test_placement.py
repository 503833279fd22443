"""Where a run on a machine with N GPUs puts things, read from the graph itself, without a GPU.

`harness.tf.run.build(..., has_gpu=True)` builds the graph exactly as on a
GPU machine (the CPU remap only happens without a GPU), and building needs
no device. The input-only stand-in carries the full matrix of paths, variable
updates, data formats and precisions for 2 and 4 GPUs; ResNet-50 itself is
built for a few combinations, where NCHW, fp16 and XLA change the towers.
"""

from __future__ import annotations

import re

import pytest
from path_lists import default_paths

from consumers import declared
from core.config import BenchConfig, apply_defaults
from frameworks.tf_env import import_tf
from harness.tf.placement import TOWER_INPUTS, VARIABLE_OPS
from harness.tf.run import build

tf = import_tf()
declared.load("tf")

PATHS = default_paths("tf")
UPDATES = [("replicated", "cpu"), ("parameter_server", "cpu"), ("parameter_server", "gpu")]
CPU = "/device:CPU:0"
UPDATE_OPS = re.compile(r"^(Resource)?Apply")  # ApplyGradientDescent, ApplyMomentum, ...


def gpu(k: int) -> str:
    return f"/device:GPU:{k}"


def make(path: str, n: int, update=("replicated", "cpu"), resnet: bool = False, **flags):
    """The graph of `path` as a machine with `n` GPUs builds it (input-only model unless `resnet`)."""
    cfg = BenchConfig(
        paths=[path],
        num_gpus=n,
        batch=2,
        image_size=32,
        variable_update=update[0],
        ps_device=update[1],
        input_only=not resnet,
        **flags,
    )
    apply_defaults(cfg, n)
    return build(cfg, path, n, has_gpu=True, endpoint="ipc:///tmp/feedbench-placement-not-bound")


# Ops that only view or convert a tensor where it is: a variable's read, and the baseline's
# bitcast, reshape and cast from the types a GPU variable holds (consumers/gpu/tf.py).
VIEWS = frozenset({"Identity", "Bitcast", "Reshape", "StridedSlice", "Cast"})


def source(t):
    """The op that makes tensor `t`, looking through the ops in VIEWS."""
    op = t.op
    while op.type in VIEWS:
        op = op.inputs[0].op
    return op


def tower_of(op) -> int | None:
    """The tower an op was built for, from its name scope (None outside the towers).

    tensorpack's TensorInput names every tower's input ops under the first
    tower's scope, so its ops say nothing here: `check_inputs` follows them.
    """
    m = re.match(r"tower(\d+)/", op.name)
    return int(m.group(1)) if m and "/TensorInput/" not in op.name else None


def colocated(graph, op):
    """The op `op` is colocated with (a variable, for its reads, initializers and updates), or None."""
    groups = [g.decode()[len("loc:@") :] for g in op.colocation_groups() if g.decode() != f"loc:@{op.name}"]
    return graph.get_operation_by_name(groups[0]) if groups else None


def check_inputs(graph, n: int, staged: bool, source_type: str | None = None) -> None:
    """Each tower's batch on its own GPU, and (staged) each StagingArea's put and get there too."""
    towers = graph.get_collection(TOWER_INPUTS)
    assert len(towers) == n
    for k, tensors in enumerate(towers):
        for t in tensors:
            assert t.device == gpu(k), (k, t.name, t.device)
            src = source(t)
            assert src.device == gpu(k), (k, src.name, src.device)
            if source_type:
                assert src.type == source_type, (k, src.type)
            if staged:
                assert src.type == "Unstage"
    puts = [op for op in graph.get_operations() if op.type == "Stage"]
    gets = [op for op in graph.get_operations() if op.type == "Unstage"]
    assert len(puts) == len(gets) == (n if staged else 0)
    for op in puts + gets:
        assert op.device == gpu(tower_of(op)), (op.name, op.device)


def check_towers(graph, n: int) -> None:
    """Every op of tower k runs on GPU k: none on another GPU, and none on the host that reads from a GPU.

    The host side of an input (a pull, a queue, a dataset, their checks)
    stays on the host until its staging put copies it to the tower's GPU.
    """
    for op in graph.get_operations():
        k = tower_of(op)
        if k is None or op.device == gpu(k):
            continue
        group = colocated(graph, op)
        if group is not None and group.type in VARIABLE_OPS:
            # A variable's initializer, read or update (batch-norm statistics): where the variable lives.
            assert op.device in ("", group.device), (op.name, op.device, group.device)
            continue
        assert op.device in (CPU, ""), (op.name, op.type, op.device)
        for t in list(op.inputs) + [c.outputs[0] for c in op.control_inputs if c.outputs]:
            assert "GPU" not in t.op.device, (op.name, "reads", t.op.name, t.op.device)


def check_variables(graph, n: int, update: tuple[str, str]) -> None:
    """replicated: a copy per GPU and NCCL between them; parameter server: one copy on --ps-device, updated there."""
    ops = graph.get_operations()
    variables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)]
    nccl = [op for op in ops if op.type == "NcclAllReduce"]
    base = {re.sub(r"^tower\d+/", "", v.op.name) for v in variables}
    if update[0] == "replicated":
        assert len(variables) == n * len(base)
        for v in variables:
            assert v.device == gpu(tower_of(v.op) or 0), (v.name, v.device)
        assert len(nccl) == n * len(base)
        assert {op.device for op in nccl} == {gpu(k) for k in range(n)}
        return
    assert not nccl
    assert len(variables) == len(base)  # one copy, shared by the towers
    if update[1] == "cpu":
        assert {v.device for v in variables} == {CPU}
    else:
        devices = {v.device for v in variables}
        assert devices <= {gpu(k) for k in range(n)}
        if len(variables) >= n:
            assert devices == {gpu(k) for k in range(n)}  # spread over every GPU
    updates = [op for op in ops if UPDATE_OPS.match(op.type)]
    assert updates
    for op in updates:
        assert op.device == op.inputs[0].device, (op.name, op.device, op.inputs[0].device)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("update", UPDATES, ids=["replicated", "ps-cpu", "ps-gpu"])
@pytest.mark.parametrize("path", PATHS)
def test_every_path_places_its_towers_on_their_gpus(path, update, fmt, fp16, n):
    built = make(path, n, update, data_format=fmt, use_fp16=fp16)
    g = built.graph
    check_inputs(g, n, staged=path != "gpu", source_type="VariableV2" if path == "gpu" else None)
    check_towers(g, n)
    check_variables(g, n, update)


RESNET = [
    # (path, n, update, data format, fp16, xla)
    ("zmq-consume", 2, ("replicated", "cpu"), "NCHW", True, False),
    ("gpu", 2, ("parameter_server", "gpu"), "NCHW", False, True),
    ("python-queue", 4, ("parameter_server", "cpu"), "NHWC", True, False),
    ("cpu", 2, ("replicated", "cpu"), "NHWC", False, True),
]


@pytest.mark.parametrize("path, n, update, fmt, fp16, xla", RESNET)
def test_resnet50_towers_compute_on_their_gpus_in_the_asked_format_and_precision(path, n, update, fmt, fp16, xla):
    built = make(path, n, update, resnet=True, data_format=fmt, use_fp16=fp16, use_xla_compile=xla)
    g = built.graph
    check_inputs(g, n, staged=path != "gpu")
    check_towers(g, n)
    check_variables(g, n, update)
    ops = g.get_operations()
    for k in range(n):
        convs = [op for op in ops if op.type == "Conv2D" and tower_of(op) == k]
        assert len(convs) == 53  # ResNet-50's convolutions, projection shortcuts included
        for op in convs:
            assert op.device == gpu(k)
            assert op.get_attr("data_format").decode() == fmt
            assert op.get_attr("T") == (tf.float16 if fp16 else tf.float32)
        backward = [op for op in ops if op.type == "Conv2DBackpropFilter" and tower_of(op) == k]
        assert backward and all(op.device == gpu(k) for op in backward)
        compiled = [op for op in ops if tower_of(op) == k and op.node_def.attr["_XlaCompile"].b]
        if xla:
            assert len(compiled) > len(convs)
            for op in compiled:
                group = colocated(g, op)
                if group is None or group.type not in VARIABLE_OPS:  # not a variable's own read or update
                    assert op.device == gpu(k), (op.name, op.type, op.device)
        else:
            assert not compiled


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> str:
    from producers.dataset import make_dataset

    root = tmp_path_factory.mktemp("jpegs")
    make_dataset(root, 2, 4)
    return str(root)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("update", UPDATES, ids=["replicated", "ps-cpu", "ps-gpu"])
def test_dali_decoding_on_the_host_feeds_each_gpu_through_its_staging(jpegs, update, n):
    pytest.importorskip("nvidia.dali.plugin.tf", reason="DALI's TensorFlow plugin is not installed")
    built = make("dali", n, update, data=jpegs, dali_device="cpu")
    g = built.graph
    check_inputs(g, n, staged=True)
    check_towers(g, n)
    check_variables(g, n, update)
    datasets = [op for op in g.get_operations() if op.type == "DALIDataset"]
    assert len(datasets) == n  # one pipeline per tower (its own shard)
    assert {op.device for op in datasets} == {CPU}
    from nvidia.dali import types

    assert [op.get_attr("device_id") for op in datasets] == [types.CPU_ONLY_DEVICE_ID] * n  # no GPU used by DALI


@pytest.mark.parametrize("update", UPDATES, ids=["replicated", "ps-cpu", "ps-gpu"])
def test_dali_decoding_on_the_gpu_makes_each_towers_dataset_and_iterator_there(jpegs, update):
    pytest.importorskip("nvidia.dali.plugin.tf", reason="DALI's TensorFlow plugin is not installed")
    n = 2
    try:
        built = make("dali", n, update, data=jpegs, dali_device="gpu")
    except RuntimeError as e:
        if "CUDA" not in str(e) and "GPU" not in str(e) and "pipeline" not in str(e):
            raise
        pytest.skip("DALI cannot make a GPU pipeline without CUDA on this machine")
    g = built.graph
    check_inputs(g, n, staged=False, source_type="IteratorGetNext")
    check_variables(g, n, update)
    for kind in ("DALIDataset", "IteratorV2", "MakeIterator", "IteratorGetNext"):
        ops = [op for op in g.get_operations() if op.type == kind]
        assert sorted(op.device for op in ops) == [gpu(k) for k in range(n)], kind
    datasets = sorted((op for op in g.get_operations() if op.type == "DALIDataset"), key=lambda op: op.device)
    assert [op.get_attr("device_id") for op in datasets] == list(range(n))


def test_one_dali_device_for_the_path_and_the_producers(jpegs, tmp_path):
    """--dali-device reaches both DALI paths; the default is the GPU where there is one."""
    from runner.producer_group import start_producers

    cfg = BenchConfig(paths=["zmq-consume"], producer_kind="dali", data=jpegs, producers=1)
    apply_defaults(cfg, 2)
    assert cfg.dali_device == "gpu"
    apply_defaults(cpu_only := BenchConfig(paths=["dali"]), 0)
    assert cpu_only.dali_device == "cpu"
    group = start_producers(cfg, f"ipc://{tmp_path}/feed", str(tmp_path))
    try:
        cmd = group.commands[0]
        assert cmd[cmd.index("--dali-device") + 1] == "gpu"
    finally:
        group.stop()


def test_dali_on_the_gpu_without_one_is_one_clear_error(procs, jpegs):
    p = procs.start("bench_input.py", "--fake-location", "dali", "--data", jpegs, "--dali-device", "gpu")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert [ln for ln in err.splitlines() if ln.startswith("error")] == [
        "error: --dali-device gpu: no GPU here; DALI decodes on the CPU (--dali-device cpu)"
    ]
