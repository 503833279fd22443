"""`cpu`: random images made by PyTorch on the host every step, then copied to the device.

The naive feeder: the generation sits on the step's critical path, so the
input wait is all of it. The copy itself is what any feeder must do: from a
small ring of pinned buffers, on a side stream without the host waiting for
it (a pageable copy would block the host every step). A buffer is written
again only once its last copy is done (why: feeders/device_copy.py).
"""

from __future__ import annotations

import torch

from consumers.cpu.path import PATH
from consumers.torch_half import RankContext, TorchInputPath, labels_of
from core.registry import register
from feeders.device_copy import CopySources, SideCopy
from frameworks.torch_trace import stage

RING = 4  # host buffers: the step's copy may still be reading the last few


@register
class HostRandom(TorchInputPath):
    declaration = PATH

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        self.g = torch.Generator().manual_seed(ctx.rank)
        self.cuda = ctx.device.type == "cuda"
        b, s = self.cfg.batch, self.cfg.image_size
        self.ring = [
            (torch.empty((b, s, s, 3), dtype=torch.uint8, pin_memory=self.cuda),
             torch.empty((b,), dtype=torch.int32, pin_memory=self.cuda))
            for _ in range(RING if self.cuda else 1)
        ]  # fmt: skip
        self.copier = SideCopy(ctx.device)
        self.copying = CopySources()  # the ring buffers a copy may still read
        self.k = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = self.k % len(self.ring)
        self.k += 1
        self.copying.keep_at_most(len(self.ring) - 1)  # buffer i's last copy (queued RING steps ago) is done
        images, labels = self.ring[i]
        with stage("feedbench.generate"):
            torch.randint(0, 256, images.shape, generator=self.g, out=images)
            torch.randint(0, 1000, labels.shape, generator=self.g, out=labels)
        pending = self.copier.start((images, labels))  # without a GPU: the buffer itself
        self.copying.add(i, pending.done)
        images, labels = self.copier.hand_over(pending)
        return images, labels_of(labels)
