"""Does TensorFlow have a GPU kernel for every op a graph puts on a GPU? Asked of its own kernel registry.

With soft placement on (the trainer's session turns it on), an op on
`/gpu:k` whose types have no GPU kernel does not fail: TensorFlow moves it to
the host and copies its inputs there and back every step. A uint8 variable
holding the baseline's batch was such an op. The registry answers without a
GPU, but only in the CUDA build of TensorFlow (the `tensorflow` wheel):
`tensorflow-cpu` registers no GPU kernels at all, so there every lookup fails
and `registry_has_gpu_kernels()` says so.
"""

from __future__ import annotations

from frameworks.tf_env import import_tf

tf = import_tf()


def _lookup(node_def) -> str:
    """The kernel class TensorFlow would run for `node_def` on its device, or "" if none fits."""
    from tensorflow.python.util import _pywrap_kernel_registry

    found = _pywrap_kernel_registry.TryFindKernelClass(node_def.SerializeToString())
    return found.decode() if isinstance(found, bytes) else found


def registry_has_gpu_kernels() -> bool:
    """True when this TensorFlow registers GPU kernels (the CUDA build), so `missing_gpu_kernels` can answer."""
    if not tf.test.is_built_with_cuda():
        return False
    probe = tf.compat.v1.NodeDef(name="probe", op="NoOp", device="/device:GPU:0")
    return bool(_lookup(probe))


def gpu_device(graph, op) -> str | None:
    """The GPU `op` is placed on: its own device, or that of the op it is colocated with (a variable)."""
    device = op.device
    if not device:
        for group in op.colocation_groups():
            name = group.decode()[len("loc:@") :]
            if name != op.name:
                device = graph.get_operation_by_name(name).device
                break
    return device if device and "GPU" in device.upper() else None


def missing_gpu_kernels(graph) -> list[str]:
    """One line per op placed on a GPU that has no GPU kernel for its attributes: `name (type, device): attrs`.

    An op with no device of its own and no colocation is left to the placer,
    which picks a device that has a kernel for it: it is not checked.
    """
    missing = []
    for op in graph.get_operations():
        device = gpu_device(graph, op)
        if device is None:
            continue
        node = tf.compat.v1.NodeDef()
        node.CopyFrom(op.node_def)
        node.device = device
        if not _lookup(node):
            types = ", ".join(
                f"{k}={tf.dtypes.as_dtype(v.type).name}"
                for k, v in sorted(node.attr.items())
                if v.WhichOneof("value") == "type"
            )
            missing.append(f"{op.name} ({op.type} on {device}): {types or 'no type attributes'}")
    return missing
