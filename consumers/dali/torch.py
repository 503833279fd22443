"""`dali`: NVIDIA DALI's PyTorch iterator on the JPEG folder, in the trainer process.

The same pipeline the `dali` producer runs (producers/dali_source.py:
read -> decode -> random-resized crop -> flip), each rank reading its own
shard of the files. `--dali-device gpu` (the default on a GPU machine)
decodes "mixed" on the rank's own GPU (`device_id` = its local rank), and the
batch comes out on that device, ordered on the step's stream; `cpu` runs
DALI in CPU-only mode, and the batch is pinned and copied to the device on a
side stream like the other paths. The result says where decoding ran.
"""

from __future__ import annotations

import torch

from consumers.dali.path import PATH
from consumers.torch_half import RankContext, TorchInputPath, labels_of
from core.errors import ConfigError
from core.registry import register
from feeders.device_copy import SideCopy
from frameworks.torch_trace import stage
from profiler.telemetry import DescribedStage


@register
class InProcessDali(TorchInputPath):
    declaration = PATH

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        from core.images.dali import build_pipeline
        from core.images.files import list_images

        cfg = self.cfg
        files, labels, _ = list_images(cfg.data, None)
        cuda = ctx.device.type == "cuda"
        self.decode = cfg.dali_device or ("gpu" if cuda else "cpu")
        if self.decode == "gpu" and not cuda:
            raise ConfigError("--dali-device gpu: this rank has no GPU; DALI decodes on the CPU (--dali-device cpu)")
        gpu_id = ctx.device.index if ctx.device.index is not None else ctx.local_rank
        self.decoded_on = f"gpu {gpu_id}" if self.decode == "gpu" else "cpu"
        self.copier = SideCopy(ctx.device)
        pipe = build_pipeline(
            cfg.data,
            files,
            labels,
            cfg.batch,
            cfg.image_size,
            device=self.decode,
            num_threads=max(1, cfg.dali_threads or 1),
            shard_id=ctx.rank,
            num_shards=ctx.world,
            device_id=gpu_id if self.decode == "gpu" else 0,
        )
        self.iterator = DALIGenericIterator(
            [pipe], ["images", "labels"], reader_name="reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True
        )
        self._it = iter(self.iterator)
        self.batches = 0

    def _run(self) -> tuple[torch.Tensor, torch.Tensor]:
        with stage("feedbench.decode"):  # DALI's pipeline: read, decode, crop, flip
            try:
                out = next(self._it)
            except StopIteration:  # end of the shard: auto_reset starts the next epoch
                self._it = iter(self.iterator)
                out = next(self._it)
        self.batches += 1
        return out[0]["images"], out[0]["labels"]

    def _pinned(self) -> list[torch.Tensor]:
        batch = self._run()
        with stage("feedbench.host_copy"):
            return [t.pin_memory() for t in batch]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ctx.device.type != "cuda":
            images, labels = self._run()  # all on the CPU
            return images, labels_of(labels)
        if self.decode == "cpu":  # decoded on the CPU for a GPU: pinned, then a side-stream copy
            # This step's batch only: DALI's own queue reads ahead, so asking for the next one here would
            # make this step wait for it.
            images, labels = self.copier.copy(self._pinned())
            return images, labels_of(labels)
        images, labels = self._run()  # on the GPU (mixed) already
        # Labels stay on the host in a mixed pipeline: 4 bytes an image, pinned, copied, widened on the device.
        with stage("feedbench.host_copy"):
            labels = labels.pin_memory()
        return images, labels_of(self.copier.copy([labels])[0])

    def sampled_stages(self) -> list:
        return [
            DescribedStage(
                "decoder", {"kind": "DALI", "device": self.decoded_on, "threads": max(1, self.cfg.dali_threads or 1)}
            )
        ]

    def result_fields(self) -> dict:
        return {"batches_pulled": self.batches}

    def close(self) -> None:
        self.iterator = None
        self._it = None
