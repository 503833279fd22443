"""The input-only stand-in reads every byte of the batch once, without widening it."""

from __future__ import annotations

import numpy as np
import pytest

from frameworks.tf_env import import_tf
from models.tf.input_only import InputOnlyModel, touch_every_byte

tf = import_tf()


@pytest.mark.parametrize("image_size", [32, 30])  # 32: whole 64-bit words per image; 30: the byte-wise fallback
def test_the_touch_depends_on_every_byte_and_widens_nothing(image_size):
    rng = np.random.default_rng(0)
    batch = rng.integers(0, 256, (4, image_size, image_size, 3), dtype=np.uint8)
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.uint8, batch.shape)
        touched = touch_every_byte(images, image_size * image_size * 3)
        casts = [op for op in graph.get_operations() if op.type == "Cast" and op.inputs[0].dtype == tf.uint8]
        assert not casts  # no pixel is widened
        with tf.compat.v1.Session() as sess:
            value = sess.run(touched, {images: batch})
            zeros = sess.run(touched, {images: np.zeros_like(batch)})
            last = np.zeros_like(batch)
            last.flat[-1] = 1  # only the very last byte set: still seen
            seen = sess.run(touched, {images: last})
    if image_size * image_size * 3 % 8 == 0:
        assert value == np.frombuffer(batch.tobytes(), np.int64).max()
    else:
        assert value == 1
    assert zeros == 0 and seen != 0


def test_the_model_trains_one_scalar_with_a_finite_loss():
    graph = tf.Graph()
    with graph.as_default():
        model = InputOnlyModel(32)
        images = tf.compat.v1.placeholder(tf.uint8, (2, 32, 32, 3))
        labels = tf.compat.v1.placeholder(tf.int32, (2,))
        cost = model.build_graph(images, labels)
        train = model.optimizer().minimize(cost)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            full = np.full((2, 32, 32, 3), 255, np.uint8)
            loss, _ = sess.run([cost, train], {images: full, labels: [999, 3]})
    assert np.isfinite(loss) and loss > 0
