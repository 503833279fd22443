"""`cpu`: random images made by PyTorch on the host every step, then copied to the device.

The naive feeder: generation and a pageable host-to-device copy sit on the
step's critical path, so the input wait is all of it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from core.registry import register
from torch_trainer.inputs.base import RankContext, TorchInputPath


@register
class HostRandom(TorchInputPath):
    name: ClassVar[str] = "cpu"
    summary: ClassVar[str] = "random images made by PyTorch on the CPU every step, copied to the device"
    order: ClassVar[int] = 10
    advice: ClassVar[str] = "generate on the device, or feed from producers"

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        self.g = torch.Generator().manual_seed(ctx.rank)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        b, s = self.cfg.batch, self.cfg.image_size
        images = torch.randint(0, 256, (b, s, s, 3), dtype=torch.uint8, generator=self.g)
        labels = torch.randint(0, 1000, (b,), dtype=torch.int64, generator=self.g)
        return images.to(self.ctx.device), labels.to(self.ctx.device)
