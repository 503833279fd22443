"""`cpu`: fresh random images made by TensorFlow on the CPU every step, then staged onto each device.

Each step pays the host-to-device copy and the host's work, but no Python.
"""

from __future__ import annotations

from tensorpack.input_source import InputSource, TensorInput

from consumers.cpu.path import PATH
from consumers.tf_half import NUM_CLASSES, TFInputPath
from core.registry import register
from frameworks.tf_env import import_tf

tf = import_tf()


@register
class HostRandom(TFInputPath):
    declaration = PATH

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        def fn() -> list:
            out = []
            with tf.device("/cpu:0"):
                for s in specs:
                    high = NUM_CLASSES if len(s.shape) == 1 else 256
                    x = tf.random.uniform(s.shape, 0, high, dtype=tf.int32)
                    out.append(x if s.dtype == tf.int32 else tf.cast(x, s.dtype))
            return out

        return TensorInput(fn)
