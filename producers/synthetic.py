"""Synthetic batches: random images with a label each, cycled.

Generating 9.6 MB of random pixels per batch would cost more than sending it,
so each worker draws a few source images once (`TILES`: they fit in a core's
cache) and lays them out in `pool` batches, each a different rotation of them.
Over ipc:// and tcp:// the pool's batches are sent round and round: they are
never written again, which is what makes zero-copy sends safe. Over shm://
the sender hands the source a free slot and the source writes the batch into
it image by image from the cached source images: every byte of every batch is
written anew, as a decoder writes its output, and the bytes are the same as
the pool batch's.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from core.images.tiles import CLASSES, POOL, SEED, TILES, source_tiles


@dataclass(frozen=True)
class SyntheticSource:
    """Batches of uint8 NHWC images and int32 labels; picklable, built in each worker."""

    batch: int = 64
    image_size: int = 224
    classes: int = CLASSES
    pool: int = POOL
    seed: int = SEED
    cpu_ms: float = 0.0  # CPU time spent per batch, as decoding and augmenting would (0: none)

    # The sender may hand us buffers to write into (shm:// slots).
    fills_buffers = True
    # Numpy only, built after the fork: a worker copied from the launcher starts in milliseconds, where a
    # spawned one imports numpy and zmq again and brings up multiprocessing's resource tracker.
    start_method = "fork"

    def __call__(
        self, worker: int, buffers: Callable[[], list[np.ndarray] | None] | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        tiles, tile_labels = source_tiles(self.seed, worker, max(TILES, self.pool), self.image_size, self.classes)
        order = [[(p + j) % len(tiles) for j in range(self.batch)] for p in range(self.pool)]  # distinct rotations
        images = [tiles[o] for o in order]
        labels = [tile_labels[o] for o in order]
        for a in images + labels:
            a.flags.writeable = False
        for i in itertools.count():
            if self.cpu_ms > 0:
                _burn(self.cpu_ms / 1e3)
            p = i % self.pool
            out = buffers() if buffers is not None else None  # views shaped like our first batch, or None
            if out is None:
                yield images[p], labels[p]
                continue
            for j, t in enumerate(order[p]):  # written anew from the cached tiles: pool batch p, byte for byte
                out[0][j] = tiles[t]
            out[1][...] = labels[p]
            yield out[0], out[1]

    def describe(self) -> str:
        burn = f", {self.cpu_ms:g} ms CPU per batch" if self.cpu_ms else ""
        return f"synthetic {self.batch}x{self.image_size}x{self.image_size}x3 uint8{burn}"


def _burn(seconds: float) -> None:
    """Use `seconds` of this process's CPU time (not wall time: a busy machine takes longer)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
