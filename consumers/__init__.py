"""Consumers: one folder per input path, the Python pull consumer (zmq_pull) and its exact per-producer accounting.

A path's folder holds its declaration (`path.py`, neither TensorFlow nor
PyTorch) and beside it a half per framework (`tf.py`, `torch.py`), as DALI's
plugins sit over its neutral base. What several halves of one framework
share is `tf_*.py` or `torch_*.py` here; every other module of this package
imports neither framework (tests/test_layout.py).

Importing the package sets TensorFlow's environment (no TensorFlow is imported): a TensorFlow half
imported on its own (`consumers.<path>.tf`) then still finds it set before tensorpack imports TensorFlow.
"""

import frameworks.tf_env  # noqa: F401
