"""Consumers: receive batches from producers into the trainer (Python, tf.data, the zmq op, constants)."""

import trainer.tf_env  # noqa: E402,F401  (TensorFlow's environment, before tensorpack imports it)
