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

With --loader, row i is sample i mod n of the user's map-style dataset, read in a pool of actors
(consumers/ray_data/loader_rows.py).
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


def dataset(
    rows: int, batch: int, size: int, data: str | None, block_batches: int, loader: Any = None, actors: int = 1
) -> Any:
    """The dataset: `rows` images (synthetic, decoded from the folder `data`, or read from the map-style dataset
    of `loader`, a checked LoaderSpec, by up to `actors` actors), `block_batches` batches a block, made by Ray
    as the ranks take them."""
    import os

    import ray.data

    from consumers.ray_data.loader_rows import LoaderRows, run_paths
    from core.images.files import list_images

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the run's own progress line is the one on the terminal
    ctx.print_on_execution_start = False
    source = ray.data.range(rows, override_num_blocks=max(1, rows // (batch * block_batches)))
    if loader is not None:  # one copy of the user's dataset per actor (consumers/ray_data/loader_rows.py)
        kw = {"spec": loader, "size": size, "batch": batch, "paths": run_paths()}
        pool = ray.data.ActorPoolStrategy(min_size=1, max_size=actors)
        # No CPU reserved: actors holding every CPU of the cluster would leave none for the range's tasks.
        return source.map_batches(
            LoaderRows, fn_constructor_kwargs=kw, compute=pool, num_cpus=0, batch_size=batch, batch_format="numpy"
        )
    if data is None:
        make = functools.partial(synthetic_rows, batch=batch, size=size)
    else:  # listed once, here; the workers read the files at the same absolute path
        files, labels, _ = list_images(data)
        make = functools.partial(decoded_rows, root=os.path.abspath(data), files=files, labels=labels, size=size)
    return source.map_batches(make, batch_size=batch, batch_format="numpy")
