"""An emulated accelerator as a tensorpack ModelDesc: consumes each batch at a fixed rate.

Each tower runs one EmulatedDeviceStep (a native op, models/emulated_op/):
it reads the batch once and finishes batch / rate seconds after its device
time began, using no host CPU and not holding the GIL. One trainable scalar
makes the optimizer and the variable update run as for a real model.
"""

from __future__ import annotations

from frameworks.tf_env import import_tf
from models.tf.input_only import InputOnlyModel

tf = import_tf()

_ops = None
# Share of a step's period of host work between two steps that the device hides, as a GPU's
# queue hides the host launching the next step (see docs/emulated.md). Small, so that waiting
# for input is never made up for by more than that.
HOST_OVERLAP = 0.1


def emulated_ops():
    """The loaded op library, built first if missing or stale (a few seconds, once)."""
    global _ops
    if _ops is None:
        from models.tf.emulated_op import build

        _ops = tf.load_op_library(str(build.build(verbose=True)))
    return _ops


def emulated_device_step(images, rate: float, overlap: float = HOST_OVERLAP):
    """One device step at `rate` images/s: a float scalar near 1.0 that is ready at the step's deadline."""
    return emulated_ops().emulated_device_step(images, rate=float(rate), overlap=float(overlap))


class EmulatedModel(InputOnlyModel):
    """A device training at `rate` images/s per tower, in place of ResNet-50.

    The input-only stand-in's inputs and optimizer; its step is the emulated device's.
    """

    def __init__(self, image_size: int, rate: float) -> None:
        super().__init__(image_size)
        self.rate = rate
        emulated_ops()  # build and load before the graph is built, not inside a tower

    def build_graph(self, images, labels):
        w = tf.compat.v1.get_variable("w", shape=(), initializer=tf.compat.v1.ones_initializer())
        work = emulated_device_step(images, self.rate)
        # The labels read on the device: int32 reductions and arithmetic on a GPU run on host memory (their
        # kernels keep int32 there), so the labels are widened to float32 first and stay on the GPU.
        touched = tf.reduce_sum(tf.cast(labels, tf.float32)) * 1e-12
        return tf.identity(w * (work + touched) * 1e-3, name="cost")
