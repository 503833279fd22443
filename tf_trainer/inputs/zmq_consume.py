"""The zmq-consume input: batches enter the graph through the native zmq_ops pull op.

No Python runs per batch: the op's kernel receives on its own thread and
copies each frame once into a tensor. This is the path the benchmark exists
to measure. The connection binds, so any number of producers can connect.
"""

from __future__ import annotations

import re

from tensorpack.input_source import TensorInput

from consumers.expect import BatchSpec, batch_source
from tf_trainer.tf_env import tf

tf = tf()


def zmq_op_input(
    endpoint: str,
    batch: int,
    image_size: int,
    hwm: int = 4,
    recv_timeout: float | None = None,
    max_msg_size: int | None = None,
    expected: BatchSpec | None = None,
) -> TensorInput:
    """One ZMQPullSocket shared by all towers; each tower's pull takes its own batch."""
    import zmq_ops  # the op library is built by `make op`; import it only when this path runs

    sock = zmq_ops.ZMQPullSocket(
        endpoint,
        [tf.uint8, tf.int32],
        hwm=hwm,
        bind=True,
        timeout_ms=-1 if recv_timeout is None else int(recv_timeout * 1000),
        max_msg_size=-1 if max_msg_size is None else int(max_msg_size),
    )

    def fn() -> list:
        spec = expected or BatchSpec.images(batch, image_size)
        with tf.device("/cpu:0"):
            # The op checks the count and dtypes of each message; a batch of another shape stops the
            # step here, on the host, before it is staged (see `batch_error`).
            pulled = sock.pull()
            return [
                tf.ensure_shape(t, shape, name=f"{EXPECTED}{i}")
                for i, (t, (_, shape)) in enumerate(zip(pulled, spec.tensors, strict=True))
            ]

    source = TensorInput(fn)
    source.zmq_socket = sock  # the run reads the connection's counters through it
    return source


EXPECTED = "expected_batch_"  # name of the shape checks, so a failing one is told from other errors
_SHAPE = re.compile(r"Shape of tensor \S* ?(\[[\d,]*\]) is not compatible with expected shape (\[[\d,]*\])")


def batch_error(e: Exception, endpoint: str, expected: BatchSpec) -> str | None:
    """The line for a step that failed on a batch the run does not expect, or None for any other failure."""
    op = getattr(e, "op", None)
    if op is None:
        return None
    text = getattr(e, "message", str(e))
    if op.type == "ZMQPull":
        # The op's own words name the endpoint and both counts or dtypes; other pull errors are not ours.
        found = re.search(r"(n_tensors|tensor\[\d+\]\.dtype): message from .*", text)
        return found.group(0) if found else None
    if op.type != "EnsureShape" or EXPECTED not in op.name:
        return None
    i = op.inputs[0].value_index  # which of the pulled tensors
    found = _SHAPE.search(text)
    got = found.group(1) if found else "another shape"
    dtype = expected.tensors[i][0] if i < len(expected.tensors) else ""
    return f"{batch_source(endpoint, None)} has {dtype} {got} as tensor {i}; the run expects {expected}"
