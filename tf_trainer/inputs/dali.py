"""`dali`: a DALI pipeline inside the trainer, through DALI's TensorFlow plugin.

The same pipeline the `dali` producer runs (producers/dali_source.py), but
its batches enter the graph through `DALIDataset` instead of crossing a ZMQ
socket, so in-process DALI and DALI-over-ZMQ can be compared side by side.
Run only when asked for: it needs a JPEG folder (--data) and the plugin.
"""

from __future__ import annotations

import os

from tensorpack.input_source import InputSource, TFDatasetInput

from core.errors import ConfigError
from core.registry import register
from tf_trainer.inputs.base import TFInputPath
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


@register
class InProcessDali(TFInputPath):
    name = "dali"
    summary = "a DALI pipeline in the trainer's process (DALI's TensorFlow plugin); needs --data"
    order = 50
    in_default_run = False
    advice = "DALI's pipeline limits: raise --dali-threads, or decode on the GPU"
    input_op_types = frozenset({"IteratorGetNext"})

    @classmethod
    def validate(cls, cfg) -> None:
        if not cfg.data or not os.path.isdir(cfg.data):
            raise ConfigError(
                "--fake-location dali needs --data DIR, a JPEG folder (make one: python -m producers make-dataset DIR)"
            )
        if not plugin_available():
            raise ConfigError(f"--fake-location dali: DALI's TensorFlow plugin is not installed; {INSTALL_HINT}")

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        """Decode, random-resized-crop and flip JPEGs from --data with DALI, as a tf.data input."""
        import nvidia.dali.plugin.tf as dali_tf
        from tensorflow.python.data.ops.dataset_ops import DatasetV1Adapter

        from producers.dali_source import build_pipeline
        from producers.decode import list_images

        c = self.cfg
        files, labels, _ = list_images(c.data, None)
        device = "gpu" if has_gpu else "cpu"
        pipe = build_pipeline(
            c.data, files, labels, c.batch, c.image_size, device=device, num_threads=max(1, c.dali_threads)
        )
        with tf.device("/gpu:0" if has_gpu else "/cpu:0"):
            ds = dali_tf.DALIDataset(
                pipeline=pipe,
                batch_size=c.batch,
                output_shapes=tuple(tuple(s.shape) for s in specs),
                output_dtypes=tuple(s.dtype for s in specs),
                device_id=0 if has_gpu else None,
            )
        # tensorpack's TFDatasetInput reads the TF1 dataset API (output_types, ...); DALIDataset is a TF2 dataset.
        return TFDatasetInput(DatasetV1Adapter(ds))
