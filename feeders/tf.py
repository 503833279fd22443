"""Put every received batch into a StagingArea on its tower's device, and report how full they are.

With staging, step k trains on the batch copied to the device during step
k-1, so the host-to-device copy overlaps compute, as in tensorflow/benchmarks.
The on-device baseline needs no staging: its data never moves; it and the
in-graph DALI path put their tensors on the tower's device (`tower_device`).
"""

from __future__ import annotations

from tensorpack.input_source import FeedfreeInput, InputSource, QueueInput, StagingInput

from frameworks.tf_env import import_tf
from profiler.telemetry import staging_figures

tf = import_tf()


def stage_onto_devices(source: InputSource, stages: int = 1) -> InputSource:
    """Wrap a feed-free input so each tower unstages a batch prefetched onto its device."""
    if not isinstance(source, (FeedfreeInput, QueueInput)):
        raise TypeError(f"cannot stage {type(source).__name__}: it is not a feed-free input")
    return StagingInput(source, nr_stage=stages)


class Staging:
    """The staging stage: wraps a source, and fetches every tower's StagingArea size with each measured step.

    The areas are found in the built graph by their Stage ops; a StageSize op
    with the same attributes, colocated with each, reads how many batches wait.
    """

    name = "staging"
    capacity = 1
    input_op_types = frozenset({"Unstage"})

    def __init__(self, stages: int = 1) -> None:
        self.stages = stages
        self.sizes: list[float] = []
        self.towers = 0

    def wrap(self, source: InputSource) -> InputSource:
        return stage_onto_devices(source, self.stages)

    def fetches(self) -> list | None:
        graph = tf.compat.v1.get_default_graph()
        sizes = []
        with tf.name_scope("telemetry"):
            for op in graph.get_operations():
                if op.type != "Stage":
                    continue
                with tf.compat.v1.colocate_with(op):
                    sizes.append(
                        tf.raw_ops.StageSize(
                            dtypes=op.get_attr("dtypes"),
                            capacity=op.get_attr("capacity"),
                            memory_limit=op.get_attr("memory_limit"),
                            container=op.get_attr("container"),
                            shared_name=op.get_attr("shared_name"),
                        )
                    )
        self.towers = len(sizes)
        return sizes or None

    def record(self, value) -> None:
        self.sizes.append(sum(int(x) for x in value) / len(value))

    def figures(self) -> dict | None:
        return staging_figures(self.sizes, self.capacity, self.towers)

    def live(self) -> str:
        return ""


def tower_device() -> str:
    """The device an op created here would run on: the tower's, under any device function.

    Made for inputs that must live on their tower's device: enter
    `tf.device(tower_device())` and the parameter-server device function
    leaves what is created inside where it is.
    """
    probe = tf.no_op(name="tower_device")
    return probe.device
