"""The TensorFlow input paths: how each way of feeding enters the graph."""

import tf_trainer.tf_env  # noqa: E402,F401  (TensorFlow's environment, before tensorpack imports it)
