"""`gpu`: one constant batch already on each device, the ceiling every other path is measured against."""

from __future__ import annotations

import torch

from consumers.gpu.path import PATH
from consumers.torch_half import RankContext, TorchInputPath
from core.registry import register


@register
class OnDevice(TorchInputPath):
    declaration = PATH

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        g = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
        b, s = self.cfg.batch, self.cfg.image_size
        self.images = torch.randint(0, 256, (b, s, s, 3), dtype=torch.uint8, device=ctx.device, generator=g)
        self.labels = torch.randint(0, 1000, (b,), dtype=torch.int64, device=ctx.device, generator=g)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images, self.labels
