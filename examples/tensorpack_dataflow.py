"""A tensorpack DataFlow with the augmentors of tensorpack's ResNet example, as a feedbench loader.

    python -m producers make-dataset data/ --classes 10 --per-class 50
    python bench_input.py --loader examples/tensorpack_dataflow.py:make_dataflow \
        --loader-arg data=data/ --loader-only

The augmentors are `fbresnet_augmentor(isTrain=True)` of tensorpack's
examples/ImageNetModels/imagenet_utils.py (GoogLeNet-style random crop,
colour jitter in random order, PCA lighting, flip) on images read with
OpenCV, as that example reads them; the batch is turned from BGR to RGB at
the end, because the model takes RGB.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tensorpack imports TensorFlow; its Keras 2 layers need this
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from tensorpack.dataflow import (  # noqa: E402
    AugmentImageComponent,
    BatchData,
    DataFromList,
    MapData,
    MapDataComponent,
    MultiProcessRunnerZMQ,
    imgaug,
)

JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")


def fbresnet_augmentor(image_size: int = 224) -> list:
    """tensorpack's ResNet example's training augmentors (imagenet_utils.fbresnet_augmentor(True))."""
    return [
        imgaug.GoogleNetRandomCropAndResize(target_shape=image_size, interp=cv2.INTER_CUBIC),
        imgaug.ToFloat32(),  # avoid frequent casting in each colour augmentation
        imgaug.RandomOrderAug(
            [
                imgaug.BrightnessScale((0.6, 1.4)),
                imgaug.Contrast((0.6, 1.4), rgb=False),
                imgaug.Saturation(0.4, rgb=False),
                # rgb-bgr conversion for the constants copied from fb.resnet.torch
                imgaug.Lighting(
                    0.1,
                    eigval=np.asarray([0.2175, 0.0188, 0.0045][::-1]) * 255.0,
                    eigvec=np.array(
                        [[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]],
                        dtype="float32",
                    )[::-1, ::-1],
                ),
            ]
        ),
        imgaug.ToUint8(),
        imgaug.Flip(horiz=True),
    ]


def image_list(data: str) -> list[tuple[str, int]]:
    """(path, label) of every JPEG in an ImageNet-layout folder; label = index of the sorted class folder."""
    classes = sorted(d for d in os.listdir(data) if os.path.isdir(os.path.join(data, d)))
    return [
        (os.path.join(data, c, f), label)
        for label, c in enumerate(classes)
        for f in sorted(os.listdir(os.path.join(data, c)))
        if f.lower().endswith(JPEG_SUFFIXES)
    ]


def make_dataflow(
    data: str = "data/",
    batch_size: int = 64,
    image_size: int = 224,
    num_proc: int = 0,
    seed: int = 0,
):
    """Read (OpenCV, BGR), augment, batch; `num_proc` > 0 runs it in that many processes, as the example does."""
    files = image_list(data)
    np.random.seed(seed % 2**32)
    ds = DataFromList(files, shuffle=True)
    ds = MapDataComponent(ds, lambda path: cv2.imread(path, cv2.IMREAD_COLOR), 0)
    ds = AugmentImageComponent(ds, fbresnet_augmentor(image_size), copy=False)
    if num_proc > 0:
        ds = MultiProcessRunnerZMQ(ds, num_proc)
    ds = BatchData(ds, batch_size, remainder=False)
    return MapData(ds, lambda dp: [np.ascontiguousarray(dp[0][..., ::-1]), dp[1]])  # BGR -> RGB
