"""The `loader` path's DataLoader batches go to the device on a side stream, through the feeder's SideCopy (the
helper every other PyTorch path copies with), so the copy overlaps the step before it. Needs a CUDA GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the side stream is CUDA's"),
]

LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset

def make_loader(batch_size=4, image_size=16):
    images = torch.arange(8 * image_size * image_size * 3, dtype=torch.int64).remainder(256).to(torch.uint8)
    images = images.view(8, image_size, image_size, 3)
    return DataLoader(TensorDataset(images, torch.arange(8, dtype=torch.int32)), batch_size=batch_size)
"""


def test_a_dataloaders_batch_is_copied_on_the_side_stream_and_arrives_whole(tmp_path, monkeypatch):
    from consumers.loader.torch import UserLoader
    from consumers.torch_half import RankContext
    from core.config import BenchConfig
    from feeders.device_copy import SideCopy

    (tmp_path / "side_loader.py").write_text(LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = BenchConfig(paths=["loader"], loader="side_loader:make_loader", batch=4, image_size=16)
    device = torch.device("cuda", 0)
    ctx = RankContext(0, 1, 0, device, str(tmp_path), str(tmp_path))
    path = UserLoader(cfg)
    path.open(ctx)
    try:
        assert isinstance(path.copier, SideCopy) and path.copier.stream != torch.cuda.current_stream(device)
        images, labels = path.next()
        assert images.is_cuda and labels.dtype == torch.int64
        expected = torch.arange(4 * 16 * 16 * 3).remainder(256).to(torch.uint8).view(4, 16, 16, 3)
        assert torch.equal(images.cpu(), expected) and labels.cpu().tolist() == [0, 1, 2, 3]
    finally:
        path.close()
