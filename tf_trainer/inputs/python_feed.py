"""Python-side inputs: batches pulled by pyzmq in Python, then handed to TensorFlow.

`python-queue` feeds a TF FIFOQueue from a Python thread (tensorpack's
QueueInput); `python-dataset` wraps the same puller in tf.data's
from_generator. Both pay for Python and the GIL on every batch, which is
what they are here to measure against the native op.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from tensorpack.dataflow import DataFlow
from tensorpack.input_source import QueueInput, TFDatasetInput

from consumers.zmq_pull import PullConsumer
from tf_trainer.tf_env import tf

tf = tf()


class PullFlow(DataFlow):
    """A tensorpack DataFlow over a PullConsumer; the socket is opened lazily in the feeding thread."""

    def __init__(
        self,
        endpoint: str,
        hwm: int,
        recv_timeout: float | None,
        max_msg_size: int | None = None,
        allow_remote: bool = False,
        curve_keys: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.curve_keys = curve_keys
        self.allow_remote = allow_remote
        self.hwm = hwm
        self.recv_timeout = recv_timeout
        self.max_msg_size = max_msg_size
        self.consumer: PullConsumer | None = None

    def open(self) -> PullConsumer:
        """Bind now, so producers can connect before the graph runs."""
        if self.consumer is None:
            self.consumer = PullConsumer(
                self.endpoint,
                bind=True,
                hwm=self.hwm,
                recv_timeout=self.recv_timeout,
                max_msg_size=self.max_msg_size,
                allow_remote=self.allow_remote,
                curve_keys=self.curve_keys,
            )
        return self.consumer

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        consumer = self.open()
        while True:
            yield consumer.recv().arrays

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None


def python_queue_input(flow: PullFlow, capacity: int = 8) -> QueueInput:
    """tensorpack's QueueInput: a Python thread enqueues into a TF FIFOQueue on the CPU."""
    queue = tf.compat.v1.FIFOQueue(capacity, [tf.uint8, tf.int32], name="python_queue")
    return QueueInput(flow, queue=queue)


def python_dataset_input(flow: PullFlow, batch: int, image_size: int, prefetch: int = 2) -> TFDatasetInput:
    """tf.data from_generator over the puller, prefetched."""
    shapes = ((batch, image_size, image_size, 3), (batch,))

    def gen():
        for arrays in flow:
            yield tuple(arrays)

    ds = tf.data.Dataset.from_generator(gen, output_types=(tf.uint8, tf.int32), output_shapes=shapes)
    return TFDatasetInput(ds.prefetch(prefetch))
