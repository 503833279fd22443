"""The in-process DALI input: a DALI pipeline inside the trainer, through DALI's TensorFlow plugin.

The same pipeline the `dali` producer runs (producers/dali_source.py), but
its batches enter the graph through `DALIDataset` instead of crossing a ZMQ
socket, so in-process DALI and DALI-over-ZMQ can be compared side by side.
"""

from __future__ import annotations

from tensorpack.input_source import TFDatasetInput

from tf_trainer.tf_env import tf

tf = tf()

INSTALL_HINT = (
    "pip install -e '.[dali]' (nvidia-dali-cuda120 and nvidia-dali-tf-plugin-cuda120, built with --no-build-isolation)"
)


def plugin_available() -> bool:
    try:
        import nvidia.dali.plugin.tf  # noqa: F401
    except ImportError:
        return False
    return True


def dali_dataset_input(data: str, batch: int, image_size: int, num_threads: int, gpu: bool) -> TFDatasetInput:
    """Decode, random-resized-crop and flip JPEGs from `data` with DALI, as a tf.data input."""
    import nvidia.dali.plugin.tf as dali_tf

    from producers.dali_source import build_pipeline
    from producers.decode import list_images

    files, labels, _ = list_images(data, None)
    device = "gpu" if gpu else "cpu"
    pipe = build_pipeline(data, files, labels, batch, image_size, device=device, num_threads=num_threads)
    with tf.device("/gpu:0" if gpu else "/cpu:0"):
        ds = dali_tf.DALIDataset(
            pipeline=pipe,
            batch_size=batch,
            output_shapes=((batch, image_size, image_size, 3), (batch,)),
            output_dtypes=(tf.uint8, tf.int32),
            device_id=0 if gpu else None,
        )
    # tensorpack's TFDatasetInput reads the TF1 dataset API (output_types, ...); DALIDataset is a TF2 dataset.
    from tensorflow.python.data.ops.dataset_ops import DatasetV1Adapter

    return TFDatasetInput(DatasetV1Adapter(ds))
