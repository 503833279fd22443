"""The Ray Data pipeline a `ray-data` run iterates: the synthetic or the decode producers' work, as Ray tasks.

Row i is image i of the run: batch k = i // batch, position j = i % batch, laid
out as the synthetic producers lay out theirs (producers/synthetic.py: pool
batch k mod POOL is a rotation of a few cached random tiles, each with its own
label), so a model learns the same labels whichever path feeds it. Each row
carries its sequence number (`seq` = i) through the pipeline, and the ranks
count every image that reaches a step once. A block holds --ray-block-batches
batches: it is what a Ray task makes and what the split hands a rank, and each
costs Ray's per-task overhead (about 30-50 ms on a 2-core host: at one batch a
block, 47 ms a batch, which capped a cheap pipeline far below what Ray Data
gives with blocks of 8 batches, 10 ms).

With --producer-kind decode, row i is file i mod n of the folder (core/images/files.py's order), read and
decoded by the decode producers' default decoder (core/images/decoders.py: the random-resized crop, flip
and resize in one call), its augmentation drawn from the row's own sequence number. A file that cannot be
decoded stops the run with Ray's error naming it, as the producers' `--on-bad-file fail` does.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from core.images.tiles import CLASSES, POOL, SEED, TILES, source_tiles


@functools.lru_cache(maxsize=4)
def _tiles(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The tiles and their labels, drawn as a synthetic producer's worker 0 draws them."""
    return source_tiles(SEED, 0, max(TILES, POOL), size, CLASSES)


def synthetic_rows(rows: dict[str, np.ndarray], batch: int, size: int) -> dict[str, np.ndarray]:
    """Rows `id` -> their images, labels and sequence numbers (a Ray Data `map_batches` function)."""
    tiles, labels = _tiles(size)
    seq = rows["id"].astype(np.int64)
    tile = ((seq // batch) % POOL + seq % batch) % len(tiles)
    return {"image": tiles[tile], "label": labels[tile], "seq": seq}


def decoded_rows(
    rows: dict[str, np.ndarray], root: str, files: list[str], labels: list[int], size: int
) -> dict[str, np.ndarray]:
    """Rows `id` -> the folder's files decoded, their labels and sequence numbers (a `map_batches` function)."""
    import random

    from core.images.decoders import DECODERS, DEFAULT_DECODER
    from core.images.files import read_file
    from core.images.jpeg_roi import library

    library()  # the ROI decoder's native code, built or found once per worker process
    decode = DECODERS[DEFAULT_DECODER]
    seq = rows["id"].astype(np.int64)
    images = np.empty((len(seq), size, size, 3), np.uint8)
    for k, s in enumerate(seq.tolist()):
        path = f"{root}/{files[s % len(files)]}"
        try:
            decode(read_file(path), random.Random(s), images[k])
        except Exception as e:
            raise ValueError(f"cannot decode {path}: {e}") from None
    return {"image": images, "label": np.asarray([labels[s % len(files)] for s in seq.tolist()], np.int32), "seq": seq}


def rows_needed(batches: int, batch: int, world: int, prefetch: int, block_batches: int) -> int:
    """Rows for one pass that covers the run: every rank's batches, what its iterator prefetches, and a spare,
    in whole blocks of `block_batches` batches."""
    need = world * (batches + prefetch + 2)
    return batch * block_batches * -(-need // block_batches)


def dataset(rows: int, batch: int, size: int, data: str | None, block_batches: int) -> Any:
    """The dataset: `rows` images (synthetic, or decoded from the folder `data`), `block_batches` batches a
    block, made by Ray tasks as the ranks take them."""
    import os

    import ray.data

    from core.images.files import list_images

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the run's own progress line is the one on the terminal
    ctx.print_on_execution_start = False
    source = ray.data.range(rows, override_num_blocks=max(1, rows // (batch * block_batches)))
    if data is None:
        make = functools.partial(synthetic_rows, batch=batch, size=size)
    else:  # listed once, here; the workers read the files at the same absolute path
        files, labels, _ = list_images(data)
        make = functools.partial(decoded_rows, root=os.path.abspath(data), files=files, labels=labels, size=size)
    return source.map_batches(make, batch_size=batch, batch_format="numpy")
