"""ResNet-50 as a tensorpack ModelDesc: uint8 images in, cross-entropy + weight decay out.

Images arrive as uint8 NHWC, the way every input path of feedbench delivers
them, and are converted and normalised on the device inside the graph, so the
bytes on the wire and in the staging areas stay four times smaller than float32.
"""

from __future__ import annotations

from tensorpack import ModelDesc
from tensorpack.tfutils.common import get_global_step_var
from tensorpack.tfutils.optimizer import ProxyOptimizer
from tensorpack.tfutils.summary import add_moving_summary
from tensorpack.tfutils.tower import get_current_tower_context

from frameworks.tf_env import import_tf
from models.tf.resnet import DATA_FORMATS, VERSIONS, ResNet50

tf = import_tf()
v1 = tf.compat.v1

# ImageNet channel statistics, in the 0-255 pixel scale (RGB).
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class LossScaleOptimizer(ProxyOptimizer):
    """Static loss scaling for float16 training.

    Gradients are computed from ``loss * scale``, so small float16 gradients do
    not underflow, and divided by ``scale`` before they are applied. The cost
    the model returns (and every summary of it) stays the real, unscaled loss.
    """

    def __init__(self, opt: v1.train.Optimizer, scale: float) -> None:
        super().__init__(opt, name="LossScaleOptimizer")
        self.scale = float(scale)

    def compute_gradients(self, loss, *args, **kwargs):
        scaled = tf.multiply(loss, self.scale, name="scaled_cost")
        grads = self._opt.compute_gradients(scaled, *args, **kwargs)
        return [(None if g is None else g / self.scale, v) for g, v in grads]


class ResNet50Model(ModelDesc):
    """ResNet-50 (v1 or v1.5) trained with momentum SGD, in float32 or float16 with float32 master weights."""

    def __init__(
        self,
        version: str = "1.5",
        data_format: str = "NHWC",
        image_size: int = 224,
        use_fp16: bool = False,
        loss_scale: float = 128.0,
        use_xla: bool = False,
        num_classes: int = 1000,
        learning_rate: float = 0.1,
        warmup_steps: int = 0,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"ResNet version must be one of {VERSIONS}, got {version!r}")
        if data_format not in DATA_FORMATS:
            raise ValueError(f"data_format must be one of {DATA_FORMATS}, got {data_format!r}")
        if loss_scale <= 0:
            raise ValueError(f"loss_scale must be positive, got {loss_scale}")
        self.version = version
        self.data_format = data_format
        self.image_size = image_size
        self.use_fp16 = use_fp16
        self.loss_scale = loss_scale
        self.use_xla = use_xla
        self.num_classes = num_classes
        self.learning_rate = learning_rate
        self.warmup_steps = warmup_steps
        self.momentum = momentum
        self.weight_decay = weight_decay

    def inputs(self) -> list:
        return [
            tf.TensorSpec((None, self.image_size, self.image_size, 3), tf.uint8, "images"),
            tf.TensorSpec((None,), tf.int32, "labels"),
        ]

    def preprocess(self, images):
        """uint8 NHWC -> normalised float32 in the model's data format (runs on the tower's device)."""
        with tf.name_scope("preprocess"):
            x = tf.cast(images, tf.float32)
            x = (x - tf.constant(IMAGENET_MEAN, tf.float32)) / tf.constant(IMAGENET_STD, tf.float32)
            if self.data_format == "NCHW":
                x = tf.transpose(x, [0, 3, 1, 2])
            return x

    def build_graph(self, images, labels):
        ctx = get_current_tower_context()
        training = ctx.is_training if ctx is not None else True
        main_tower = ctx.is_main_training_tower if ctx is not None else True

        net = ResNet50(
            version=self.version,
            data_format=self.data_format,
            num_classes=self.num_classes,
            dtype=tf.float16 if self.use_fp16 else tf.float32,
            use_xla=self.use_xla,
        )
        logits = net(self.preprocess(images), training=training, update_stats=main_tower)

        xentropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        xentropy = tf.reduce_mean(xentropy, name="xentropy-loss")
        wd_cost = tf.multiply(
            self.weight_decay, tf.add_n([tf.nn.l2_loss(w) for w in net.getter.weights]), name="wd_cost"
        )
        cost = tf.add(xentropy, wd_cost, name="cost")

        correct = tf.cast(tf.nn.in_top_k(predictions=logits, targets=labels, k=1), tf.float32)
        train_error = tf.subtract(1.0, tf.reduce_mean(correct), name="train-error-top1")
        # Moving summaries cost nothing unless tensorpack's MovingAverageSummary callback runs them.
        # On the host: summary ops have no GPU kernel, and their averages are four scalars.
        with tf.device("/cpu:0"):
            add_moving_summary(xentropy, wd_cost, cost, train_error)
        return cost

    def optimizer(self) -> v1.train.Optimizer:
        """Momentum SGD at the learning rate, warmed up linearly over the warm-up steps (profiler/training.py)."""
        lr = self.learning_rate
        if self.warmup_steps > 0:
            step = tf.cast(get_global_step_var(), tf.float32)  # tensorpack counts every step run
            lr = tf.multiply(lr, tf.minimum(1.0, (step + 1.0) / self.warmup_steps), name="learning_rate")
        opt = v1.train.MomentumOptimizer(lr, self.momentum)
        if self.use_fp16:
            opt = LossScaleOptimizer(opt, self.loss_scale)
        return opt
