"""`python-queue`: a Python thread pulls batches with pyzmq and enqueues them into a TF FIFOQueue.

tensorpack's QueueInput; the queue reports its own occupancy every step
(an empty queue means the input limits, a full one that the trainer does).
"""

from __future__ import annotations

from tensorpack.input_source import InputSource, QueueInput

from consumers.python_queue.path import PATH
from consumers.tf_pull import PythonPull
from core.registry import register
from frameworks.tf_env import import_tf
from profiler.telemetry import SampledQueue

tf = import_tf()

CAPACITY = 8


class QueueStage(SampledQueue):
    """The FIFOQueue's size, fetched with every measured step; its figures are any sampled queue's."""

    def __init__(self, queue, capacity: int) -> None:
        super().__init__([], capacity)
        self.queue = queue

    def fetches(self):
        return self.queue.size()

    def record(self, value) -> None:
        self.sizes.append(int(value))

    def live(self) -> str:
        return f"queue {self.sizes[-1]}/{self.capacity}" if self.sizes else ""


@register
class PythonQueue(PythonPull):
    declaration = PATH
    input_op_types = frozenset({"QueueDequeueV2", "QueueDequeueManyV2", "QueueDequeueUpToV2"})

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        queue = tf.compat.v1.FIFOQueue(CAPACITY, [s.dtype for s in specs], name="python_queue")
        self.queue_stage = QueueStage(queue, CAPACITY)
        return QueueInput(self.dataflow(specs), queue=queue)

    def sampled_stages(self) -> list:
        return [self.queue_stage, *super().sampled_stages()]
