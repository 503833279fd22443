"""Consumers: one folder per input path, the Python pull consumer (zmq_pull) and its exact per-producer accounting.

A path's folder holds its declaration (`path.py`, neither TensorFlow nor
PyTorch) and beside it a half per framework (`tf.py`, `torch.py`), as DALI's
plugins sit over its neutral base. What several halves of one framework
share is `tf_*.py` or `torch_*.py` here; every other module of this package
imports neither framework (tests/test_layout.py).

Importing the package sets TensorFlow's environment (no TensorFlow is imported): a TensorFlow half
imported on its own (`consumers.<path>.tf`) then still finds it set before tensorpack imports TensorFlow.

A path may also live outside the project, in a `consumers/<path>/` folder of another place on
sys.path (PYTHONPATH): the package's path takes in every `consumers/` folder there (pkgutil.extend_path),
so the path is found, listed and run as one of the project's own (consumers/declared.py).
"""

import pkgutil

import frameworks.tf_env  # noqa: F401

__path__ = pkgutil.extend_path(__path__, __name__)
