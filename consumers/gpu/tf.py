"""`gpu`: a random but constant batch already on each tower's device, the baseline of every comparison.

The input costs nothing per step, so its images/s is the ceiling the other
paths are measured against (and the data never moves, so no staging).

Where it lives matters: TensorFlow has no GPU kernel for a uint8 or int32
variable, and with soft placement on it would quietly keep such a variable
on the host and copy the whole batch to the GPU every step, which is the very
cost this baseline must not pay. So the bytes are stored as words of a type
a GPU variable can hold (uint32 for the pixels, int64 for the labels) and
turned back into the model's types on the device: a bitcast and a reshape
(no copy) for the pixels, a cast for the labels. The model then converts
uint8 to float on the device, exactly as it does for every other path.
"""

from __future__ import annotations

import numpy as np
from tensorpack.input_source import InputSource, TensorInput
from tensorpack.tfutils.tower import get_current_tower_context

from consumers.gpu.path import PATH
from consumers.tf_half import TFInputPath, random_batch
from core.registry import register
from feeders.tf import tower_device
from frameworks.tf_env import import_tf

tf = import_tf()

WORD_BYTES = 4  # pixels are held as uint32: one word per four uint8 pixels


def device_storage(array: np.ndarray) -> np.ndarray:
    """`array` as a type a GPU variable holds: uint8 as padded uint32 words, other integers as int64."""
    if array.dtype == np.uint8:
        flat = array.reshape(-1)
        padded = np.zeros(-(-flat.size // WORD_BYTES) * WORD_BYTES, np.uint8)
        padded[: flat.size] = flat
        return padded.view(np.uint32)
    if np.issubdtype(array.dtype, np.integer):
        return array.astype(np.int64)
    return array  # float types have GPU variables as they are


def from_storage(stored, spec):
    """The tensor `spec` describes, from its stored form, computed on the device the stored form is on."""
    if spec.dtype == tf.uint8:
        size = int(np.prod(spec.shape))
        flat = tf.reshape(tf.bitcast(stored, tf.uint8), [-1])  # uint32[w] -> uint8[w, 4] -> uint8[4w]: no copy
        if flat.shape[0] != size:
            flat = flat[:size]
        return tf.reshape(flat, spec.shape)
    if stored.dtype != spec.dtype:
        return tf.cast(stored, spec.dtype)
    return tf.identity(stored)


@register
class OnDevice(TFInputPath):
    declaration = PATH
    staged = False

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        stored = [device_storage(a) for a in random_batch(specs)]

        def fn() -> list:
            idx = get_current_tower_context().index
            # Local variables: the batch is copied to the device once, at initialisation; local, so
            # replicated training neither syncs nor checkpoints them. Pinned to the tower's device, or
            # the parameter-server trainer would place them like parameters, on another GPU.
            local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
            with tf.device(tower_device()):
                return [
                    from_storage(
                        tf.compat.v1.Variable(a, trainable=False, collections=local, name=f"on_device_{s.name}{idx}"),
                        s,
                    )
                    for a, s in zip(stored, specs, strict=True)
                ]

        return TensorInput(fn)
