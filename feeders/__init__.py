"""Feeders: stage each tower's batch onto its device ahead of the step that uses it."""

import trainer.tf_env  # noqa: E402,F401  (TensorFlow's environment, before tensorpack imports it)
