"""ResNet-50 model: parameter count, where each version strides, on-device preprocessing, and real training steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tensorpack import FeedInput, SimpleTrainer, TrainConfig, launch_train_with_config
from tensorpack.callbacks import Callback
from tensorpack.dataflow import DataFromList
from tensorpack.tfutils.tower import TowerContext

from frameworks.tf_env import import_tf
from models.tf import LossScaleOptimizer, ResNet50Model, count_params, stride_layout
from models.tf.model_desc import IMAGENET_MEAN, IMAGENET_STD

tf = import_tf()
v1 = tf.compat.v1

RESNET50_PARAMS = 25_557_032
DOWNSAMPLING_BLOCKS = ("group1/block0", "group2/block0", "group3/block0")


@pytest.mark.parametrize("version", ["1", "1.5"])
def test_parameter_count_is_resnet50(version):
    n = count_params(version)
    assert 25_500_000 <= n <= 25_600_000
    assert n == RESNET50_PARAMS


def test_fp16_keeps_the_same_parameters():
    assert count_params("1.5", use_fp16=True) == RESNET50_PARAMS


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_v1_strides_on_the_first_1x1_and_v15_on_the_3x3(data_format):
    v1_layout = stride_layout("1", data_format)
    v15_layout = stride_layout("1.5", data_format)
    assert len(v1_layout) == len(v15_layout) == 53  # 1 stem + 16 blocks x 3 + 4 projection shortcuts
    for block in DOWNSAMPLING_BLOCKS:
        assert (v1_layout[f"{block}/conv1"], v1_layout[f"{block}/conv2"]) == (2, 1)
        assert (v15_layout[f"{block}/conv1"], v15_layout[f"{block}/conv2"]) == (1, 2)
        assert v1_layout[f"{block}/convshortcut"] == v15_layout[f"{block}/convshortcut"] == 2
    # Everything else is the same in both versions: the stem and nothing else strides.
    expected_strided = {"conv0"} | {f"{b}/{c}" for b in DOWNSAMPLING_BLOCKS for c in ("convshortcut",)}
    assert {k for k, s in v1_layout.items() if s == 2} == expected_strided | {f"{b}/conv1" for b in DOWNSAMPLING_BLOCKS}
    assert {k for k, s in v15_layout.items() if s == 2} == expected_strided | {
        f"{b}/conv2" for b in DOWNSAMPLING_BLOCKS
    }
    assert v1_layout["group0/block0/conv1"] == v1_layout["group0/block0/conv2"] == 1


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_preprocess_normalises_uint8_in_the_graph(data_format):
    model = ResNet50Model(data_format=data_format, image_size=4)
    images = np.random.default_rng(1).integers(0, 256, (2, 4, 4, 3), dtype=np.uint8)
    with tf.Graph().as_default(), v1.Session() as sess:
        ph = v1.placeholder(tf.uint8, (None, 4, 4, 3))
        got = sess.run(model.preprocess(ph), {ph: images})
    want = (images.astype(np.float32) - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD, np.float32)
    if data_format == "NCHW":
        want = want.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class _RecordCost(Callback):
    """Fetches the model's cost along with every training step, and a batch-norm moving mean at the end."""

    def _setup_graph(self):
        self.cost = self.trainer.tower_func.towers[0].get_tensor("cost")
        self.costs: list[float] = []

    def _before_run(self, _):
        return v1.train.SessionRunArgs(fetches=self.cost)

    def _after_run(self, _, values):
        self.costs.append(float(values.results))

    def _after_train(self):
        moving_mean = [v for v in v1.global_variables() if v.op.name == "conv0/bn/mean/EMA"][0]
        self.final_moving_mean = self.trainer.sess.run(moving_mean)


def _train(model: ResNet50Model, batch: int = 2, steps: int = 2) -> tuple[_RecordCost, tf.Graph]:
    rng = np.random.default_rng(0)
    size = model.image_size
    datapoints = [
        [rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8), rng.integers(0, 1000, batch).astype(np.int32)]
        for _ in range(steps)
    ]
    record = _RecordCost()
    graph = tf.Graph()
    with graph.as_default():
        config = TrainConfig(
            model=model,
            data=FeedInput(DataFromList(datapoints, shuffle=False), infinite=True),
            callbacks=[record],
            steps_per_epoch=steps,
            max_epoch=1,
        )
        launch_train_with_config(config, SimpleTrainer())
    return record, graph


@pytest.mark.parametrize("use_fp16", [False, True], ids=["fp32", "fp16"])
def test_training_steps_give_a_finite_unscaled_loss(use_fp16):
    model = ResNet50Model(version="1.5", data_format="NHWC", image_size=32, use_fp16=use_fp16, learning_rate=0.01)
    record, graph = _train(model)
    costs = record.costs

    assert len(costs) == 2
    assert all(math.isfinite(c) for c in costs)
    # Cross-entropy over 1000 classes starts near ln(1000) = 6.9, plus weight decay: an unscaled loss,
    # far below what 128 x loss would be.
    assert 5 < costs[0] < 20
    # Batch-norm moving averages start at zero and are updated by the training steps.
    assert np.all(np.isfinite(record.final_moving_mean))
    assert np.any(record.final_moving_mean != 0)

    # The images enter the graph as uint8; the float conversion is part of the graph.
    images = graph.get_tensor_by_name("images:0")
    assert images.dtype == tf.uint8
    assert any(op.type == "Cast" for op in images.consumers())
    assert graph.get_tensor_by_name("labels:0").dtype == tf.int32

    with graph.as_default():
        variables = v1.global_variables()
    assert all(v.dtype.base_dtype == tf.float32 for v in variables if "/W" in v.name or "/bn/" in v.name)
    conv_dtypes = {op.get_attr("T") for op in graph.get_operations() if op.type == "Conv2D"}
    assert conv_dtypes == {tf.float16 if use_fp16 else tf.float32}


def test_loss_scale_optimizer_unscales_gradients():
    with tf.Graph().as_default(), v1.Session() as sess:
        w = v1.get_variable("w", initializer=np.array([1.0, -2.0, 3.0], np.float32))
        loss = tf.reduce_sum(w * w) * 1e-3
        plain = v1.train.GradientDescentOptimizer(1.0).compute_gradients(loss, [w])
        scaled_opt = LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), 128.0)
        scaled = scaled_opt.compute_gradients(loss, var_list=[w])
        sess.run(v1.global_variables_initializer())
        g_plain, g_scaled = sess.run([plain[0][0], scaled[0][0]])
        scaled_cost = tf.compat.v1.get_default_graph().get_tensor_by_name("scaled_cost:0")
        assert sess.run(scaled_cost) == pytest.approx(128.0 * sess.run(loss))
    np.testing.assert_allclose(g_scaled, g_plain, rtol=1e-6)


def test_optimizer_is_momentum_and_scales_only_in_fp16():
    with tf.Graph().as_default():
        fp32_opt = ResNet50Model().get_optimizer()
    with tf.Graph().as_default():
        fp16_opt = ResNet50Model(use_fp16=True, loss_scale=256.0).get_optimizer()
    assert isinstance(fp32_opt, v1.train.MomentumOptimizer)
    assert isinstance(fp16_opt, LossScaleOptimizer)
    assert fp16_opt.scale == 256.0


def test_xla_compiles_forward_and_backward():
    model = ResNet50Model(image_size=32, use_xla=True, learning_rate=0.01)
    with tf.Graph().as_default(), v1.Session() as sess:
        images = v1.placeholder(tf.uint8, (2, 32, 32, 3))
        labels = v1.placeholder(tf.int32, (2,))
        cost = model.build_graph(images, labels)
        opt = model.get_optimizer()
        train_op = opt.apply_gradients(opt.compute_gradients(cost))
        sess.run(v1.global_variables_initializer())
        metadata = v1.RunMetadata()
        feed = {images: np.zeros((2, 32, 32, 3), np.uint8), labels: [3, 5]}
        value, _ = sess.run(
            [cost, train_op], feed, options=v1.RunOptions(output_partition_graphs=True), run_metadata=metadata
        )
    assert math.isfinite(value)
    ops = [node.op for g in metadata.partition_graphs for node in g.node]
    assert "_XlaRun" in ops
    # Every convolution, forward and backward, went into an XLA cluster.
    assert not [op for op in ops if "Conv2D" in op]


def test_only_a_training_tower_updates_batch_norm_statistics():
    model = ResNet50Model(image_size=32)
    counts = {}
    for training in (True, False):
        with tf.Graph().as_default(), TowerContext("", is_training=training):
            model.build_graph(*[v1.placeholder(s.dtype, s.shape, s.name) for s in model.inputs()])
            counts[training] = len(v1.get_collection(v1.GraphKeys.UPDATE_OPS))
    assert counts == {True: 53 * 2, False: 0}  # moving mean and variance of each of the 53 batch norms


@pytest.mark.parametrize(
    "kwargs",
    [{"version": "2"}, {"data_format": "NCWH"}, {"loss_scale": 0.0}],
)
def test_bad_arguments_are_rejected(kwargs):
    with pytest.raises(ValueError):
        ResNet50Model(**kwargs)
