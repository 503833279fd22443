"""The TensorFlow plugin of the harness: the multi-device ResNet-50 trainer and its measurement loop.

tensorpack on TF graph mode; its input paths are the `tf.py` halves in
`consumers/<path>/`. Nothing here imports PyTorch.
"""

from frameworks import tf_env  # noqa: E402  (TensorFlow's environment, before tensorpack imports it)

tf_env.import_tf()  # imported here, before tensorpack does, so that its start-up noise is filtered
