"""Import TensorFlow the way tensorpack 0.11 needs it on TensorFlow 2.21.

tensorpack uses the Keras 2 layers (tf_keras) and v1 graph-mode APIs, so
TF_USE_LEGACY_KERAS must be set before TensorFlow is first imported and v2
behaviour turned off before any graph is built. Every module that builds a
graph imports TensorFlow through `import_tf()` so the order is always right,
with one idiom at the top of the module:

    from frameworks.tf_env import import_tf

    tf = import_tf()
"""

from __future__ import annotations

import os
from types import ModuleType

# Set on import of this module, which every package that builds graphs imports from its
# __init__, so they hold even when tensorpack (which imports TensorFlow) is imported first.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_tf: ModuleType | None = None


def import_tf() -> ModuleType:
    """TensorFlow in v1-compatible graph mode (imported once, quietly)."""
    global _tf
    if _tf is None:
        import tensorflow

        tensorflow.compat.v1.disable_v2_behavior()
        _tf = tensorflow
    return _tf
