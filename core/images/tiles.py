"""The synthetic producers' source images: a few random tiles per worker, each with one label.

Shared by both ends of the wire that make synthetic batches the same way: the synthetic producers
(producers/synthetic.py) and the ray-data pipeline (consumers/ray_data/pipeline.py), so a model learns the same
labels whichever path feeds it.
"""

from __future__ import annotations

import numpy as np

TILES = 8  # source images per worker (at 224x224, 1.2 MB: they stay in cache while a batch is written)
POOL = 4  # batches each worker lays out, each a different rotation of its tiles
SEED = 0
CLASSES = 1000


def source_tiles(seed: int, worker: int, count: int, size: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A worker's cached source images and one label per image, drawn from its own seed. One label per source
    image, wherever it lands in a batch, gives labels a model can learn: a label drawn per position would give
    the same image many labels, a loss with a floor and gradients that never settle."""
    rng = np.random.default_rng([seed, worker])
    tiles = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    return tiles, rng.integers(0, classes, (count,), dtype=np.int32)
