"""torchvision's ImageFolder with the standard ImageNet training transforms, as a feedbench loader.

    python -m producers make-dataset data/ --classes 10 --per-class 50
    python bench_input.py --loader examples/torchvision_imagefolder.py:make_loader \
        --loader-arg data=data/ --loader-only --emulate H100 --num-devices 8

The transforms are torchvision's ImageNet training recipe (RandomResizedCrop,
RandomHorizontalFlip) ending in uint8 HWC, as most fast pipelines do: the
float conversion and the mean/std normalisation (ToTensor, Normalize) run on
the device, where they cost nothing next to the model, instead of making the
host copy four times the bytes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


class ToUint8HWC:
    """A PIL image as a uint8 HWC tensor (what the model takes; it normalises on the device)."""

    def __call__(self, img) -> torch.Tensor:
        return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True))

    def __repr__(self) -> str:
        return "ToUint8HWC()"


def train_transforms(image_size: int = 224) -> transforms.Compose:
    return transforms.Compose(
        [transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(), ToUint8HWC()]
    )


def make_dataset(data: str = "data/", image_size: int = 224) -> datasets.ImageFolder:
    """The map-style Dataset alone: feedbench batches its samples itself."""
    return datasets.ImageFolder(data, transform=train_transforms(image_size))


def make_loader(
    data: str = "data/",
    batch_size: int = 64,
    image_size: int = 224,
    num_workers: int = 2,
    seed: int = 0,
    start_method: str | None = None,
) -> DataLoader:
    """The DataLoader a training script would iterate (feedbench passes each copy its own seed).

    `start_method`: how its workers start (`spawn`, macOS's and Windows' default, starts each in a fresh
    interpreter that imports torch again); the platform's own (`fork` on Linux) when None.
    """
    g = torch.Generator()
    g.manual_seed(seed)
    return DataLoader(
        make_dataset(data, image_size),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        drop_last=True,
        generator=g,
        persistent_workers=num_workers > 0,
        multiprocessing_context=start_method if num_workers > 0 else None,
    )
