"""A tf.data JPEG pipeline (read, decode, random crop, resize, flip, batch), as a feedbench loader.

    python -m producers make-dataset data/ --classes 10 --per-class 50
    python bench_input.py --loader examples/tf_data_jpeg.py:make_dataset \
        --loader-arg data=data/ --loader-only

The crop is the Inception-style one of TensorFlow's own ImageNet input
pipelines (`sample_distorted_bounding_box`: 8-100% of the area, aspect
ratio 3/4 to 4/3), then a resize to image_size and a random horizontal flip;
images leave as uint8, the model normalises on the device.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")


def image_list(data: str) -> tuple[list[str], list[int]]:
    """Paths and labels of every JPEG in an ImageNet-layout folder; label = index of the sorted class folder."""
    classes = sorted(d for d in os.listdir(data) if os.path.isdir(os.path.join(data, d)))
    files, labels = [], []
    for label, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(data, c))):
            if f.lower().endswith(JPEG_SUFFIXES):
                files.append(os.path.join(data, c, f))
                labels.append(label)
    return files, labels


def make_dataset(
    data: str = "data/",
    batch_size: int = 64,
    image_size: int = 224,
    seed: int = 0,
    shard: int = 0,
    num_shards: int = 1,
    repeat: bool = True,
    num_parallel_calls: int = 0,
    prefetch: int = 0,
    private_threadpool_size: int = 0,
) -> tf.data.Dataset:
    """This worker's shard of the files, shuffled, decoded and augmented in parallel.

    `repeat`: endlessly (False: one epoch per pass, as `--loader-only --epochs` needs). The settings
    `--loader-only --tune` searches: `num_parallel_calls` of the decoding map and the batches to
    `prefetch` (0: AUTOTUNE), and the `private_threadpool_size` the pipeline runs on (0: TensorFlow's
    shared pool).
    """
    files, labels = image_list(data)
    calls = num_parallel_calls or tf.data.AUTOTUNE
    ds = tf.data.Dataset.from_tensor_slices((files, labels))
    if num_shards > 1 and len(files) >= num_shards:
        ds = ds.shard(num_shards, shard)
    ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()

    def parse(path, label):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(image),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        image = tf.slice(image, begin, size)
        image = tf.image.resize(image, [image_size, image_size])
        image = tf.image.random_flip_left_right(image)
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8), tf.cast(label, tf.int32)

    ds = ds.map(parse, num_parallel_calls=calls).batch(batch_size, drop_remainder=True)
    ds = ds.prefetch(prefetch or tf.data.AUTOTUNE)
    if private_threadpool_size:
        options = tf.data.Options()
        options.threading.private_threadpool_size = private_threadpool_size
        ds = ds.with_options(options)
    return ds
