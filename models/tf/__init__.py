"""The model feedbench trains: ResNet-50 v1 / v1.5 as a tensorpack ModelDesc.

`count_params` and `stride_layout` build the network in a throw-away graph so
that tests and users can check what a version really is without training it.
"""

from __future__ import annotations

import numpy as np

from frameworks.tf_env import import_tf
from models.tf.model_desc import LossScaleOptimizer, ResNet50Model
from models.tf.resnet import ResNet50

tf = import_tf()

__all__ = ["LossScaleOptimizer", "ResNet50", "ResNet50Model", "count_params", "stride_layout"]


def _build(version: str, data_format: str, use_fp16: bool = False, image_size: int = 224) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        model = ResNet50Model(version=version, data_format=data_format, image_size=image_size, use_fp16=use_fp16)
        model.build_graph(*[tf.compat.v1.placeholder(s.dtype, s.shape, s.name) for s in model.inputs()])
    return graph


def count_params(version: str, num_classes: int = 1000, use_fp16: bool = False) -> int:
    """Trainable parameters of ResNet-50 `version` (25,557,032 for 1000 classes, either version)."""
    graph = tf.Graph()
    with graph.as_default():
        ResNet50(version=version, num_classes=num_classes, dtype=tf.float16 if use_fp16 else tf.float32)(
            tf.compat.v1.placeholder(tf.float32, (None, 224, 224, 3))
        )
        return int(sum(np.prod(v.shape.as_list()) for v in tf.compat.v1.trainable_variables()))


def stride_layout(version: str, data_format: str = "NHWC") -> dict[str, int]:
    """Spatial stride of every convolution, keyed by its scope (e.g. ``group1/block0/conv1``).

    Read from the ``strides`` attribute of the Conv2D ops in the built graph,
    so it shows what TensorFlow will run, not what the code meant to build.
    """
    graph = _build(version, data_format)
    spatial = slice(1, 3) if data_format == "NHWC" else slice(2, 4)
    layout = {}
    for op in graph.get_operations():
        if op.type == "Conv2D":
            strides = list(op.get_attr("strides"))[spatial]
            assert strides[0] == strides[1], (op.name, strides)
            layout[op.name.rsplit("/", 1)[0]] = strides[0]
    return layout
