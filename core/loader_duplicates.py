"""Does a DataLoader setting duplicate the data? Samples per epoch with workers against one process's.

A DataLoader over an `IterableDataset` gives each of its worker processes a
copy of the dataset; unless the dataset splits its samples between them
(`torch.utils.data.get_worker_info()` in its `__iter__`), every worker
yields every sample, and an epoch at `num_workers=N` holds each sample N
times. Its images/s then count copies, and a training loop pasting that
setting sees each sample N times per epoch. A map-style dataset is split by
its sampler and cannot do this.

The check: in a fresh process, one epoch of the user's DataLoader made again
without workers, and one at each worker count asked about; an epoch that
holds more samples than the one without workers duplicates them. An epoch
that does not end within EPOCH_SECONDS (an endless stream, a large dataset)
is not checked, and the result says so.
"""

from __future__ import annotations

import time
from typing import Any

from core import loader_settings

EPOCH_SECONDS = 20.0  # an epoch's count is given up after this long (per worker count)
ITERABLE = "torch.utils.data.dataset.IterableDataset"


def unsplit_candidate(obj: Any) -> bool:
    """A DataLoader over an IterableDataset: the one kind of loader whose workers may each yield every sample."""
    mro = [f"{c.__module__}.{c.__name__}" for c in type(getattr(obj, "dataset", None)).__mro__]
    loader = [f"{c.__module__}.{c.__name__}" for c in type(obj).__mro__]
    return "torch.utils.data.dataloader.DataLoader" in loader and ITERABLE in mro


def _samples(item: Any) -> int:
    """Samples in one item a DataLoader yields: a batch's first dimension, or 1 for a sample (no batching)."""
    images = item[0] if isinstance(item, tuple | list) and item else item
    if isinstance(item, dict):
        images = next(iter(item.values()), None)
    shape = getattr(images, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) == 4 else 1


def epoch_samples(loader: Any, cap: int | None = None) -> int | None:
    """Samples in one epoch of `loader`; None when it did not end within EPOCH_SECONDS. Past `cap`, counting
    stops (the answer is then more than `cap`)."""
    deadline = time.monotonic() + EPOCH_SECONDS
    count = 0
    it = iter(loader)
    try:
        for item in it:
            count += _samples(item)
            if cap is not None and count > cap:
                return count
            if time.monotonic() > deadline:
                return None
        return count
    finally:
        del it  # stops the DataLoader's workers


def count_epochs(obj: Any, workers: list[int], name: str) -> dict[int, int | None] | None:
    """{num_workers: samples in one epoch (None: it did not end in time)} of the DataLoader `obj` made again
    with 0 and each of `workers` workers; None when it is no DataLoader over an IterableDataset (nothing to
    check). Call it where the DataLoader may start processes."""
    if not unsplit_candidate(obj):
        return None
    counts: dict[int, int | None] = {}
    for n in [0, *sorted(set(workers) - {0})]:
        setting = {**loader_settings.settings_of(obj), "num_workers": n}
        setting.update(prefetch_factor=2 if n else None, persistent_workers=False if n else None)
        one = counts.get(0)
        counts[n] = epoch_samples(loader_settings.rebuild(obj, setting, name), None if one is None else one * n)
        if counts[0] is None:
            break  # no single-process count to hold the others against
    return counts


def duplicates(counts: dict[int, int | None] | None, workers: int) -> dict | None:
    """The `duplicates` figures of a setting with `workers` DataLoader workers, from `samples_per_epoch`:
    {"checked": True, "num_workers", "samples_per_epoch", "single_process"} when its epoch holds more samples
    than one process's, {"checked": False, "num_workers", "why"} when an epoch did not end in time; None when it
    does not duplicate (or cannot)."""
    if counts is None or not workers or workers not in counts:
        return None
    one, many = counts.get(0), counts[workers]
    if one is None or many is None:
        return {"checked": False, "num_workers": workers, "why": f"an epoch did not end within {EPOCH_SECONDS:g} s"}
    if many > one:
        return {"checked": True, "num_workers": workers, "samples_per_epoch": many, "single_process": one}
    return None
