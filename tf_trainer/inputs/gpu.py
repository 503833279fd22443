"""`gpu`: a random but constant batch already on each tower's device, the baseline of every comparison.

The input costs nothing per step, so its images/s is the ceiling the other
paths are measured against (and the data never moves, so no staging).
"""

from __future__ import annotations

from tensorpack.input_source import InputSource, TensorInput
from tensorpack.tfutils.tower import get_current_tower_context

from core.registry import BASELINE, register
from tf_trainer.inputs.base import TFInputPath, random_batch
from tf_trainer.tf_env import tf

tf = tf()


@register
class OnDevice(TFInputPath):
    name = BASELINE
    summary = "synthetic batch already on the device: the baseline"
    order = 0
    staged = False
    advice = "this is the ceiling the other paths are measured against"

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        arrays = random_batch(specs)

        def fn() -> list:
            idx = get_current_tower_context().index
            # Local variables, not tf.constant: the batch lives in device memory once, not in the graph
            # proto; local, so replicated training neither syncs nor checkpoints them.
            local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
            return [
                tf.identity(
                    tf.compat.v1.Variable(a, trainable=False, collections=local, name=f"on_device_{s.name}{idx}")
                )
                for a, s in zip(arrays, specs, strict=True)
            ]

        return TensorInput(fn)
