"""Consumers: the Python pull consumer (zmq_pull) and its exact per-producer accounting; no TensorFlow."""
