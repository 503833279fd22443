"""`dali`: a DALI pipeline inside the trainer, through DALI's TensorFlow plugin.

The same pipeline the `dali` producer runs (producers/dali_source.py), but
its batches enter the graph through `DALIDataset` instead of crossing a ZMQ
socket, so in-process DALI and DALI-over-ZMQ can be compared side by side.
`--dali-device` picks where both decode (default: the GPU when there is one),
so the comparison is like for like; each result says which.
Run only when asked for: it needs a JPEG folder (--data) and the plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensorpack.input_source import FeedfreeInput, InputSource
from tensorpack.tfutils.tower import get_current_tower_context

from consumers.dali.path import PATH
from consumers.tf_half import TFInputPath
from core.registry import register
from feeders.tf import Staging, tower_device
from frameworks.tf_env import import_tf

tf = import_tf()


@register
class InProcessDali(TFInputPath):
    declaration = PATH
    input_op_types = frozenset({"IteratorGetNext"})

    def build(self, specs: list, has_gpu: bool) -> InputSource:
        # Decoded on the GPU, each tower's batch is already on its device: nothing to stage.
        source = self.input_source(specs, has_gpu)
        if self.decode_device == "gpu":
            return source
        self.staging = Staging()
        return self.staging.wrap(source)

    @property
    def decode_device(self) -> str:
        return self.cfg.dali_device or "cpu"

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        """Decode, random-resized-crop and flip JPEGs from --data with DALI: one pipeline per tower."""
        from core.images.files import list_images

        c = self.cfg
        files, labels, _ = list_images(c.data, None)

        def pipeline(tower: int):
            from core.images.dali import build_pipeline

            return build_pipeline(
                c.data,
                files,
                labels,
                c.batch,
                c.image_size,
                device=self.decode_device,
                num_threads=max(1, c.dali_threads or 1),
                shard_id=tower,
                num_shards=c.num_gpus,
                device_id=tower,
            )

        return DaliTowerInput(pipeline, specs, self.decode_device)

    def result_fields(self) -> dict:
        return {"dali_device": self.decode_device}


class DaliTowerInput(FeedfreeInput):
    """One DALIDataset per tower, read through an iterator made where the dataset sits.

    As DALI's multi-GPU TensorFlow example does: with `device="gpu"`, tower k's
    dataset (device_id=k, shard k) and its iterator are created inside
    `tf.device` of tower k's GPU, so DALI's output stays on that GPU; with
    "cpu" they sit on the host and the run stages each batch onto its tower.
    """

    def __init__(self, pipeline: Callable[[int], Any], specs: list, device: str) -> None:
        self.pipeline = pipeline
        self.specs = specs
        self.device = device
        self._initializers: list = []

    def _setup(self, input_signature) -> None:
        pass

    def _get_input_tensors(self) -> list:
        import nvidia.dali.plugin.tf as dali_tf

        tower = get_current_tower_context().index
        on_gpu = self.device == "gpu"
        # DALI reads the device from a `tf.device` string (not a device function): name the tower's own.
        with tf.device(tower_device() if on_gpu else "/cpu:0"):
            ds = dali_tf.DALIDataset(
                pipeline=self.pipeline(tower),
                batch_size=self.specs[0].shape[0],
                output_shapes=tuple(tuple(s.shape) for s in self.specs),
                output_dtypes=tuple(s.dtype for s in self.specs),
                device_id=tower if on_gpu else None,
            )
            iterator = tf.compat.v1.data.make_initializable_iterator(ds)
            self._initializers.append(iterator.initializer)
            return list(iterator.get_next())

    def _reset_state(self) -> None:
        tf.compat.v1.get_default_session().run(self._initializers)
