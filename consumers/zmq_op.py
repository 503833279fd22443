"""The zmq-consume input: batches enter the graph through the native zmq_ops pull op.

No Python runs per batch: the op's kernel receives on its own thread and
copies each frame once into a tensor. This is the path the benchmark exists
to measure. The connection binds, so any number of producers can connect.
"""

from __future__ import annotations

from tensorpack.input_source import TensorInput

from trainer.tf_env import tf

tf = tf()


def zmq_op_input(
    endpoint: str,
    batch: int,
    image_size: int,
    hwm: int = 4,
    recv_timeout: float | None = None,
    max_msg_size: int | None = None,
    curve_keys: str | None = None,
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
        curve_keys=curve_keys,
    )

    def fn() -> list:
        with tf.device("/cpu:0"):
            images, labels = sock.pull()
        images.set_shape((batch, image_size, image_size, 3))
        labels.set_shape((batch,))
        return [images, labels]

    source = TensorInput(fn)
    source.zmq_socket = sock  # the run reads the connection's counters through it
    return source
