"""The multi-device ResNet-50 trainer and its measurement loop (tensorpack on TF graph mode)."""

from tf_trainer import tf_env  # noqa: E402,F401  (TensorFlow's environment, before tensorpack imports it)
