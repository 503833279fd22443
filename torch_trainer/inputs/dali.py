"""`dali`: NVIDIA DALI's PyTorch iterator on the JPEG folder, in the trainer process.

The same pipeline the `dali` producer runs (producers/dali_source.py:
read -> decode -> random-resized crop -> flip), each rank reading its own
shard of the files. On a GPU the decoder runs "mixed" and batches come out on
the rank's device; without one, DALI runs in CPU-only mode.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch

from core.errors import ConfigError
from core.registry import register
from torch_trainer.inputs.base import RankContext, TorchInputPath, labels_of


@register
class Dali(TorchInputPath):
    name: ClassVar[str] = "dali"
    summary: ClassVar[str] = "DALI's PyTorch iterator decodes the JPEG folder in the trainer (CPU mode without a GPU)"
    order: ClassVar[int] = 50
    in_default_run: ClassVar[bool] = False
    advice: ClassVar[str] = "more DALI threads (--dali-threads), or decode on the GPU"

    @classmethod
    def validate(cls, cfg: Any) -> None:
        if not cfg.data or not os.path.isdir(cfg.data):
            raise ConfigError(
                "--fake-location dali needs --data DIR, a JPEG folder (make one: python -m producers make-dataset DIR)"
            )
        try:
            import nvidia.dali.plugin.pytorch  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"--fake-location dali: DALI's PyTorch plugin is not importable ({e})") from None

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        from producers.dali_source import build_pipeline
        from producers.decode import list_images

        cfg = self.cfg
        files, labels, _ = list_images(cfg.data, None)
        gpu = ctx.device.type == "cuda"
        pipe = build_pipeline(
            cfg.data,
            files,
            labels,
            cfg.batch,
            cfg.image_size,
            device="gpu" if gpu else "cpu",
            num_threads=cfg.dali_threads,
            shard_id=ctx.rank,
            num_shards=ctx.world,
            device_id=(ctx.device.index or 0) if gpu else 0,
        )
        self.iterator = DALIGenericIterator(
            [pipe], ["images", "labels"], reader_name="reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True
        )
        self._it = iter(self.iterator)
        self.batches = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            out = next(self._it)
        except StopIteration:  # end of the shard: auto_reset starts the next epoch
            self._it = iter(self.iterator)
            out = next(self._it)
        self.batches += 1
        d = out[0]
        dev = self.ctx.device
        return d["images"].to(dev, non_blocking=True), labels_of(d["labels"]).to(dev, non_blocking=True)

    def accounting(self) -> dict:
        return {"batches_pulled": self.batches}

    def close(self) -> None:
        self.iterator = None
        self._it = None
