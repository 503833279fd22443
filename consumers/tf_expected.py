"""Checks in the graph that each batch is what the run expects, and the one line a failing check becomes.

The Python paths compare each received batch in Python (consumers/tf_pull.py);
a path whose batches arrive as tensors (zmq-consume) checks their shapes
right where they enter the graph, on the host, before they are staged. The
zmq op checks the number of tensors and their dtypes itself.
"""

from __future__ import annotations

import re

from consumers.expect import SAME_FLAGS, BatchSpec
from frameworks.tf_env import import_tf

tf = import_tf()

CHECK = "expected_batch_"  # the shape checks' names, so a failing one is told from any other error
_SHAPE = re.compile(r"Shape of tensor \S* ?(\[[\d,]*\]) is not compatible with expected shape")


def ensure_batch(tensors: list, specs: list) -> list:
    """`tensors`, each checked at run time against its spec's full shape (the step fails on a mismatch).

    The checks run in order (each waits for the one before), so a batch wrong in several tensors is
    always named by its first, the images, not by whichever check the executor ran first.
    """
    checked: list = []
    for i, (t, s) in enumerate(zip(tensors, specs, strict=True)):
        with tf.control_dependencies(checked[-1:]):
            checked.append(tf.ensure_shape(t, s.shape, name=f"{CHECK}{i}"))
    return checked


def batch_error(e: Exception, specs: list) -> str | None:
    """The line for a step that failed an `ensure_batch` check, or None for any other failure."""
    op = getattr(e, "op", None)
    if op is None or op.type != "EnsureShape" or CHECK not in op.name:
        return None
    i = op.inputs[0].value_index  # which tensor of the batch
    found = _SHAPE.search(getattr(e, "message", str(e)))
    got = found.group(1) if found else "of another shape"
    expected = BatchSpec.from_signature(specs, 0)
    return f"batch has {expected.tensors[i][0]} {got} as tensor {i}; the run expects {expected}; {SAME_FLAGS}"
