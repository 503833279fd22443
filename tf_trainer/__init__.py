"""The multi-device ResNet-50 trainer and its measurement loop (tensorpack on TF graph mode)."""

from frameworks import tf_env  # noqa: E402,F401  (TensorFlow's environment, before tensorpack imports it)
