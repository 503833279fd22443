"""ResNet-50 v1 and v1.5 in plain TensorFlow v1 ops, for tensorpack towers.

Why plain ops and not Keras layers: tensorpack builds one copy of the network
per device inside its own variable scopes (with reuse for parameter-server
training), and `tf.compat.v1.get_variable` follows those scopes exactly.

The two versions differ only in where a downsampling bottleneck block strides:

- "1"   (original paper, tensorpack's benchmark): stride 2 on the first 1x1 conv.
- "1.5" (NVIDIA, DLPerf, tf_cnn_benchmarks' resnet50_v1.5): stride 2 on the 3x3 conv.

Both have the standard 25,557,032 trainable parameters for 1000 classes.

Mixed precision (`dtype=tf.float16`): a custom variable getter keeps every
conv/fc weight as a float32 "master" variable and hands the network a float16
cast of it. Batch-norm parameters and statistics stay float32 (fused batch norm
takes float16 activations with float32 scale/offset), and the logits are
returned in float32 so the loss is computed in float32. Loss scaling lives in
the optimizer (see `models.tf.model_desc.LossScaleOptimizer`).

XLA (`use_xla=True`): the network is built inside
`tensorflow.python.compiler.xla.jit.experimental_jit_scope`, which marks its
ops for XLA compilation. TensorFlow's gradient code compiles the gradient of a
marked op in the same way, so forward and backward are both compiled. This is
used rather than the session's `global_jit_level` because it needs nothing
from the trainer's session config, and because auto-clustering ignores CPU
devices unless `TF_XLA_FLAGS=--tf_xla_cpu_global_jit` is set before TensorFlow
starts; the scope works on CPU and GPU alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from frameworks.tf_env import import_tf

tf = import_tf()
v1 = tf.compat.v1

VERSIONS = ("1", "1.5")
DATA_FORMATS = ("NHWC", "NCHW")
# Units (bottleneck blocks) per group, and the bottleneck width of each group.
RESNET50_UNITS = (3, 4, 6, 3)
RESNET50_WIDTHS = (64, 128, 256, 512)

BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


class Float32Master:
    """Custom variable getter: float32 variables, cast to float16 where the network asks for float16.

    It also records every conv/fc weight (variables named ``W``) it hands out,
    so the model applies weight decay to the float32 masters, not the casts.
    """

    def __init__(self) -> None:
        self.weights: list = []

    def __call__(self, getter: Callable, name: str, *args: Any, dtype: Any = None, **kwargs: Any):
        wanted = tf.as_dtype(dtype) if dtype is not None else tf.float32
        var = getter(name, *args, dtype=tf.float32 if wanted == tf.float16 else dtype, **kwargs)
        if name.split("/")[-1] == "W" and all(var is not w for w in self.weights):
            self.weights.append(var)
        if wanted == tf.float16:
            return tf.cast(var, tf.float16)
        return var


class ResNet50:
    """Builds the ResNet-50 forward pass; call it on a normalised image batch to get float32 logits."""

    def __init__(
        self,
        version: str = "1.5",
        data_format: str = "NHWC",
        num_classes: int = 1000,
        dtype: Any = None,
        use_xla: bool = False,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"ResNet version must be one of {VERSIONS}, got {version!r}")
        if data_format not in DATA_FORMATS:
            raise ValueError(f"data_format must be one of {DATA_FORMATS}, got {data_format!r}")
        self.version = version
        self.data_format = data_format
        self.num_classes = num_classes
        self.dtype = tf.as_dtype(dtype or tf.float32)
        if self.dtype not in (tf.float32, tf.float16):
            raise ValueError(f"dtype must be float32 or float16, got {self.dtype.name}")
        self.use_xla = use_xla
        self.getter = Float32Master()
        self._training = True
        self._update_stats = True

    def __call__(self, images, training: bool = True, update_stats: bool = True):
        """Logits (float32) for `images`, already normalised and in `data_format` layout.

        `training` uses batch statistics in batch norm; `update_stats` also
        adds the moving-average updates to ``UPDATE_OPS`` (tensorpack only
        wants them from its main training tower).
        """
        self._training = training
        self._update_stats = training and update_stats
        with v1.variable_scope(v1.get_variable_scope(), custom_getter=self.getter), _maybe_xla(self.use_xla):
            x = tf.cast(images, self.dtype)
            x = self._conv_bn("conv0", x, 64, kernel=7, stride=2, relu=True)
            x = tf.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME", data_format=self.data_format, name="pool0")
            for g, (units, width) in enumerate(zip(RESNET50_UNITS, RESNET50_WIDTHS)):
                with v1.variable_scope(f"group{g}"):
                    for u in range(units):
                        stride = 2 if (u == 0 and g > 0) else 1
                        with v1.variable_scope(f"block{u}"):
                            x = self._bottleneck(x, width, stride)
            x = tf.reduce_mean(x, axis=self._spatial_axes, name="gap")
            x = tf.cast(x, tf.float32)
            with v1.variable_scope("linear"):
                channels = x.shape[-1]
                w = v1.get_variable(
                    "W",
                    [channels, self.num_classes],
                    dtype=tf.float32,
                    initializer=v1.random_normal_initializer(stddev=0.01),
                )
                b = v1.get_variable("b", [self.num_classes], dtype=tf.float32, initializer=v1.zeros_initializer())
                logits = tf.nn.bias_add(tf.matmul(x, w), b)
        return tf.identity(logits, name="logits")

    @property
    def _channel_axis(self) -> int:
        return 3 if self.data_format == "NHWC" else 1

    @property
    def _spatial_axes(self) -> list[int]:
        return [1, 2] if self.data_format == "NHWC" else [2, 3]

    def _bottleneck(self, x, width: int, stride: int):
        """One bottleneck unit: 1x1 -> 3x3 -> 1x1 (x4 channels), plus a projection shortcut where shapes change."""
        out_channels = width * 4
        stride_1x1, stride_3x3 = (stride, 1) if self.version == "1" else (1, stride)
        shortcut = x
        if x.shape[self._channel_axis] != out_channels or stride != 1:
            shortcut = self._conv_bn("convshortcut", x, out_channels, kernel=1, stride=stride, relu=False)
        y = self._conv_bn("conv1", x, width, kernel=1, stride=stride_1x1, relu=True)
        y = self._conv_bn("conv2", y, width, kernel=3, stride=stride_3x3, relu=True)
        y = self._conv_bn("conv3", y, out_channels, kernel=1, stride=1, relu=False, zero_gamma=True)
        return tf.nn.relu(y + shortcut, name="output")

    def _conv_bn(self, name: str, x, filters: int, kernel: int, stride: int, relu: bool, zero_gamma: bool = False):
        with v1.variable_scope(name):
            in_channels = x.shape[self._channel_axis]
            w = v1.get_variable(
                "W",
                [kernel, kernel, in_channels, filters],
                dtype=self.dtype,
                initializer=v1.variance_scaling_initializer(
                    scale=2.0, mode="fan_out", distribution="untruncated_normal"
                ),
            )
            strides = [1, stride, stride, 1] if self.data_format == "NHWC" else [1, 1, stride, stride]
            y = tf.nn.conv2d(x, w, strides=strides, padding="SAME", data_format=self.data_format, name="conv")
            y = self._batch_norm(y, filters, zero_gamma)
            return tf.nn.relu(y, name="relu") if relu else y

    def _batch_norm(self, x, channels: int, zero_gamma: bool):
        """Fused batch norm with float32 parameters and statistics, whatever the activation dtype."""
        f32 = dict(dtype=tf.float32, trainable=True)
        gamma = v1.get_variable(
            "bn/gamma", [channels], initializer=v1.zeros_initializer() if zero_gamma else v1.ones_initializer(), **f32
        )
        beta = v1.get_variable("bn/beta", [channels], initializer=v1.zeros_initializer(), **f32)
        stat = dict(dtype=tf.float32, trainable=False)
        moving_mean = v1.get_variable("bn/mean/EMA", [channels], initializer=v1.zeros_initializer(), **stat)
        moving_var = v1.get_variable("bn/variance/EMA", [channels], initializer=v1.ones_initializer(), **stat)
        fmt = self.data_format
        if not self._training:
            y, _, _ = v1.nn.fused_batch_norm(
                x, gamma, beta, moving_mean, moving_var, epsilon=BN_EPSILON, data_format=fmt, is_training=False
            )
            return y
        y, mean, variance = v1.nn.fused_batch_norm(x, gamma, beta, epsilon=BN_EPSILON, data_format=fmt)
        if self._update_stats:
            # Read by tensorpack's RunUpdateOps callback after every step.
            for var, value in ((moving_mean, mean), (moving_var, variance)):
                update = v1.assign_sub(var, (var - value) * (1.0 - BN_MOMENTUM), use_locking=False)
                v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, update.op)
        return y


def _maybe_xla(enabled: bool):
    """XLA's jit scope when `enabled`, else a scope that does nothing."""
    if not enabled:
        return contextlib.nullcontext()
    try:
        from tensorflow.python.compiler.xla import jit
    except ImportError as e:  # pragma: no cover - depends on the TensorFlow build
        raise RuntimeError(f"use_xla needs TensorFlow's XLA JIT, which this TensorFlow build lacks: {e}") from e
    return jit.experimental_jit_scope(compile_ops=True)
