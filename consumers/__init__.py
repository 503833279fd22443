"""Consumers: each input path's declaration (`<path>/path.py`), the Python pull consumer (zmq_pull) and its
exact per-producer accounting; neither TensorFlow nor PyTorch."""
