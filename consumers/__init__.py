"""Consumers: receive batches from producers into the trainer (Python, tf.data, the zmq op, constants)."""
