"""A user's `--loader` tf.data pipeline in a TensorFlow graph: checked against the model's input, and what in it
needs the trainer's Python (the `loader` path runs it in the trainer; `tf-data-service` sends it to workers)."""

from __future__ import annotations

from core.loader_spec import LoaderError, LoaderSpec
from frameworks.tf_env import import_tf

tf = import_tf()

# Ops that call back into the Python process that built the graph: a tf.data service worker (another process,
# maybe another host) has no such callback. The words say which API put them there.
PYTHON_OPS = {
    "GeneratorDataset": "Dataset.from_generator",
    "EagerPyFunc": "tf.py_function",
    "PyFunc": "tf.numpy_function",
    "PyFuncStateless": "tf.numpy_function",
}


def fitted(spec: LoaderSpec, ds, images_spec, labels_spec) -> tf.data.Dataset:
    """The user's dataset, its elements checked against the model's signature (LoaderError saying what to
    change), labels cast to the model's dtype."""
    element = ds.element_spec
    if not isinstance(element, (tuple, list)) or len(element) < 2:
        raise LoaderError(f"loader {spec.name}: its tf.data elements are {element}; expected (images, labels)")
    img, lab = element[0], element[1]
    want = images_spec.shape.as_list()
    if img.dtype != tf.uint8:
        raise LoaderError(
            f"loader {spec.name}: images are {img.dtype.name} {img.shape}; the model takes uint8 NHWC: "
            "end the pipeline with tf.cast(tf.clip_by_value(x, 0, 255), tf.uint8)"
        )
    if not img.shape.is_compatible_with(want):
        raise LoaderError(
            f"loader {spec.name}: images are {img.shape}; the model takes {want} "
            "(batch with drop_remainder=True, resize to the run's --image-size, or pass --batch)"
        )
    if not lab.dtype.is_integer:
        raise LoaderError(f"loader {spec.name}: labels are {lab.dtype.name}; expected integers (class indices)")

    @tf.autograph.experimental.do_not_convert
    def fit(*element):
        images = tf.ensure_shape(element[0], want)
        labels = tf.ensure_shape(tf.cast(tf.reshape(element[1], [-1]), labels_spec.dtype), labels_spec.shape)
        return images, labels

    return ds.map(fit)


def python_calls(ds) -> list[str]:
    """The APIs in `ds`'s pipeline that call back into this process's Python (Dataset.from_generator,
    tf.py_function, tf.numpy_function), from the ops of its graph and of every function they use, nested."""
    graph = ds._variant_tensor.graph
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    found: set[str] = set()
    ops, seen = [ds._variant_tensor.op], set()
    functions: list[str] = []
    while ops:
        op = ops.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        found.add(op.type)
        ops += [t.op for t in op.inputs] + list(op.control_inputs)
        functions += _functions_named(op.node_def)
    done: set[str] = set()
    while functions:
        name = functions.pop()
        if name in done or name not in library:
            continue
        done.add(name)
        for node in library[name].node_def:
            found.add(node.op)
            functions += _functions_named(node)
    calls = {PYTHON_OPS[t] for t in found if t in PYTHON_OPS}
    if "GeneratorDataset" in found:  # from_generator calls the generator through a numpy_function of its own
        calls.discard("tf.numpy_function")
    return sorted(calls)


def _functions_named(node_def) -> list[str]:
    """The functions a node's attributes name (a map's `f`, a filter's `predicate`, lists of them)."""
    out = []
    for attr in node_def.attr.values():
        if attr.HasField("func"):
            out.append(attr.func.name)
        out += [f.name for f in attr.list.func]
    return out
