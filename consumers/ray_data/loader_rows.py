"""`ray-data --loader`: the user's map-style dataset as the per-sample function of the Ray Data pipeline.

Ray Data hands a task any rows, so it needs the samples by index: the
loader's callable must return a map-style dataset (`__getitem__` and
`__len__`, e.g. torchvision's `ImageFolder`). It is made once in rank 0
before Ray starts (shard 0 of 1, with the run's `batch_size` and
`image_size` where it takes them), to refuse anything else and check its
first sample, then once per actor of the pipeline's `map_batches`
(`LoaderRows`): each actor reads the whole dataset, row `seq` taking sample
`seq mod len`, its random draws (Python's, numpy's, torch's) seeded with
`seq`, so a row's sample is the same whichever actor makes it.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import numpy as np

from core import loader_processes
from core.loader_spec import (
    ELSEWHERE,
    Batcher,
    LoaderError,
    LoaderSpec,
    absolute_target,
    dataset_length,
    exception_words,
    kind_of,
    returned_words,
    seed_globals,
)


class SampleCheck(Batcher):
    """The loader's first-batch checks (docs/loader.md) on one sample, its errors naming the sample."""

    def __init__(self, name: str, index: int, size: int) -> None:
        super().__init__(name, 1, None, size)
        self.index = index

    def fail(self, what: str) -> LoaderError:
        return LoaderError(f"loader {self.name}: sample {self.index}: {what}")

    def image(self, item: Any) -> tuple[np.ndarray, Any]:
        """The sample's (HWC uint8 image of the run's size, integer label), or LoaderError saying what to change."""
        img, lab = self.arrays(item)
        if img.ndim != 3:
            raise self.fail(f"its image has shape {tuple(img.shape)}; expected one HWC image (H, W, 3)")
        if np.ndim(lab) != 0:
            raise self.fail(f"its label has shape {np.shape(lab)}; expected one integer label")
        images, _ = self.check(img[None], np.asarray([lab]))
        return images[0], lab


def checked_spec(cfg: Any) -> LoaderSpec:
    """The run's --loader, made once here and refused in one line unless it is a map-style dataset whose first
    sample the model takes; what its callable started is stopped. Rank 0, before Ray starts."""
    # Its file absolute, the project's too: Ray's workers do not start in the project's folder.
    spec = LoaderSpec.parse(absolute_target(cfg.loader, project_relative=False), cfg.loader_arg)
    offer = {"batch_size": cfg.batch, "image_size": cfg.image_size}
    obj = spec.build(0, 0, 1, offer, timeout=cfg.loader_timeout)
    try:
        if kind_of(obj) != "dataset":
            raise LoaderError(
                f"loader {spec.name}: it returns {returned_words(obj)}; Ray Data hands its tasks rows by index, "
                "so --fake-location ray-data needs samples by index: return a map-style dataset (__getitem__ and "
                f"__len__, e.g. the Dataset behind your DataLoader), or {ELSEWHERE}"
            )
        read(obj, spec.name, dataset_length(obj, spec.name), 0, cfg.image_size)
    finally:
        del obj
        loader_processes.stop_started()
    return spec


def read(data: Any, name: str, n: int, seq: int, size: int) -> tuple[np.ndarray, Any]:
    """Row `seq`'s sample (index `seq mod n`), its draws seeded with `seq`, checked; LoaderError naming it."""
    index = seq % n
    seed_globals(seq)
    try:
        item = data[index]
    except Exception as e:
        raise LoaderError(f"loader {name}: sample {index} raised {exception_words(e)}") from None
    return SampleCheck(name, index, size).image(item)


class LoaderRows:
    """Rows `id` -> the loader's samples, their labels and sequence numbers (a `map_batches` callable class:
    each actor makes its own copy of the dataset once)."""

    def __init__(self, spec: LoaderSpec, size: int, batch: int, paths: list[str]) -> None:
        sys.path.extend(p for p in paths if p not in sys.path)  # the run's, for a loader named by module
        self.spec, self.size = spec, size
        self.data = spec.build(0, 0, 1, {"batch_size": batch, "image_size": size})
        self.n = dataset_length(self.data, spec.name)

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seq = rows["id"].astype(np.int64)
        images = np.empty((len(seq), self.size, self.size, 3), np.uint8)
        labels = np.empty(len(seq), np.int32)
        for k, s in enumerate(seq.tolist()):
            images[k], labels[k] = read(self.data, self.spec.name, self.n, s, self.size)
        return {"image": images, "label": labels, "seq": seq}


def run_paths() -> list[str]:
    """The run's import path, absolute (its folders as the workers will not have them)."""
    return [os.path.abspath(p or ".") for p in sys.path]


_RAISED = re.compile(r"^\S*LoaderError: (.+)$", re.MULTILINE)


def loader_error(e: BaseException) -> LoaderError | None:
    """The LoaderError a Ray worker raised (Ray hands the driver its traceback, wrapped in its own errors, as
    text): its own one line; None for any other error."""
    found = _RAISED.findall(str(e))
    return LoaderError(found[-1].strip()) if found else None
