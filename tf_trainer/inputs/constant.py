"""The two inputs that involve no producer: data already on the device, and data made on the CPU.

`gpu` is the baseline every other path is compared with: a constant batch
created on each tower's device, so the input costs nothing per step. `cpu`
synthesizes random images inside the TensorFlow runtime on the CPU every
step, so each step pays the host-to-device copy but no Python.
"""

from __future__ import annotations

import numpy as np
from tensorpack.input_source import TensorInput
from tensorpack.tfutils.tower import get_current_tower_context

from tf_trainer.tf_env import tf

tf = tf()


def on_device_input(batch: int, image_size: int, classes: int = 1000, seed: int = 0) -> TensorInput:
    """A random but constant batch per tower, created where the tower runs."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, image_size, image_size, 3), dtype=np.uint8)
    labels = rng.integers(0, classes, (batch,), dtype=np.int32)

    def fn() -> list:
        idx = get_current_tower_context().index
        # Local variables, not tf.constant: the batch lives in device memory once, not in the graph
        # proto; local, so replicated training neither syncs nor checkpoints them.
        local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        img = tf.compat.v1.Variable(images, trainable=False, collections=local, name=f"on_device_images{idx}")
        lab = tf.compat.v1.Variable(labels, trainable=False, collections=local, name=f"on_device_labels{idx}")
        return [tf.identity(img), tf.identity(lab)]

    return TensorInput(fn)


def cpu_synthetic_input(batch: int, image_size: int, classes: int = 1000) -> TensorInput:
    """Fresh random images made on the CPU by TensorFlow each step, then sent to the tower."""

    def fn() -> list:
        with tf.device("/cpu:0"):
            img = tf.random.uniform((batch, image_size, image_size, 3), 0, 256, dtype=tf.int32)
            img = tf.cast(img, tf.uint8)
            lab = tf.random.uniform((batch,), 0, classes, dtype=tf.int32)
        return [img, lab]

    return TensorInput(fn)
