"""The settings `--tune` varies, and a user's DataLoader made again with other settings, without importing torch.

A torch DataLoader is made again as its own class over its own dataset,
keeping every argument the user gave it (read back from the object:
batch size, sampler or shuffling, collate_fn, drop_last, worker_init_fn,
generator, start method, timeout, ...) and changing only the settings tuned:
`num_workers`, `prefetch_factor`, `persistent_workers`, `pin_memory`. A
`tf.data` pipeline or a tensorpack DataFlow has no such object to remake:
its callable takes the settings as keyword arguments (docs/loader.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from core.errors import FeedbenchError


class RebuildError(FeedbenchError):
    """The loader's DataLoader cannot be made again with other settings."""


DATALOADER_KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
TF_DATA_KNOBS = ("num_parallel_calls", "prefetch", "private_threadpool_size")
DATAFLOW_KNOBS = ("num_proc",)
KNOBS = {"tf.data": TF_DATA_KNOBS, "dataflow": DATAFLOW_KNOBS}  # keyword arguments of the loader's callable
_AUTO_SAMPLERS = ("RandomSampler", "SequentialSampler")  # what DataLoader makes itself from `shuffle`
_ITERABLE_SAMPLER = "_InfiniteConstantSampler"  # an IterableDataset's: DataLoader takes no sampler for it


def _sampler_args(obj: Any) -> tuple[dict, dict]:
    """(literal arguments, objects) that make the DataLoader's batches the same way again."""
    batch_sampler = obj.batch_sampler
    if obj.batch_size is None and batch_sampler is not None:  # the user's own batch_sampler
        return {}, {"batch_sampler": batch_sampler}
    literal, objects = {"batch_size": obj.batch_size}, {}
    if obj.drop_last:
        literal["drop_last"] = True
    sampler = type(obj.sampler).__name__
    if sampler == "RandomSampler":
        literal["shuffle"] = True
    if sampler != _ITERABLE_SAMPLER:
        objects["sampler"] = obj.sampler  # the same sampler (a shuffle keeps its generator)
        if sampler not in _AUTO_SAMPLERS:
            literal.pop("shuffle", None)
    return literal, objects


def _default_collate(fn: Any) -> bool:
    return getattr(fn, "__name__", "") in ("default_collate", "default_convert")


def dataloader_arguments(obj: Any) -> tuple[dict, dict]:
    """(literal arguments, other objects) the user's DataLoader was made with, apart from the tuned ones.

    The literal ones are written into the line to paste; the objects (sampler, collate_fn, generator,
    worker_init_fn) are the user's own, kept as they are.
    """
    literal, objects = _sampler_args(obj)
    if not _default_collate(obj.collate_fn):
        objects["collate_fn"] = obj.collate_fn
    for name in ("worker_init_fn", "generator"):
        if getattr(obj, name, None) is not None:
            objects[name] = getattr(obj, name)
    if obj.timeout:
        literal["timeout"] = obj.timeout
    if getattr(obj, "pin_memory_device", ""):
        literal["pin_memory_device"] = obj.pin_memory_device
    if getattr(obj, "in_order", True) is False:
        literal["in_order"] = False
    context = getattr(obj, "multiprocessing_context", None)
    if context is not None:
        literal["multiprocessing_context"] = context.get_start_method()
    return literal, objects


def settings_of(obj: Any) -> dict:
    """The tuned settings as the DataLoader has them."""
    workers = obj.num_workers
    return {
        "num_workers": workers,
        "prefetch_factor": obj.prefetch_factor if workers else None,
        "persistent_workers": bool(obj.persistent_workers) if workers else None,
        "pin_memory": bool(obj.pin_memory),
    }


def call_arguments(literal: dict, setting: dict) -> dict:
    """The DataLoader's literal arguments with `setting` in place; those a DataLoader without workers refuses,
    left out."""
    out = {**literal, **{k: v for k, v in setting.items() if v is not None}}
    if not out.get("num_workers"):
        for name in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            out.pop(name, None)
    return out


def rebuild(obj: Any, setting: dict, name: str) -> Any:
    """The user's DataLoader made again, as its own class, with `setting` in place of its tuned settings."""
    literal, objects = dataloader_arguments(obj)
    kwargs = {**objects, **call_arguments(literal, setting)}
    if "sampler" in kwargs:
        kwargs.pop("shuffle", None)  # the sampler is the shuffle
    if kwargs.get("num_workers") and "multiprocessing_context" in literal:
        kwargs["multiprocessing_context"] = obj.multiprocessing_context  # the same context object
    cls = type(obj)
    try:
        return cls(obj.dataset, **kwargs)
    except Exception as e:
        raise RebuildError(
            f"loader {name}: returns {cls.__module__}.{cls.__qualname__}, which --tune cannot make again as "
            f"{cls.__name__}(dataset, {', '.join(kwargs)}) ({type(e).__name__}: {e}); --tune needs a class "
            "that takes torch DataLoader's own arguments"
        ) from None


def callable_knobs(fn: Callable[..., Any], kind: str) -> list[str]:
    """The settings of a tf.data or DataFlow loader that its callable takes as keyword arguments."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return [k for k in KNOBS.get(kind, ()) if k in params or takes_any]


def describe(obj: Any, kind: str, fn: Callable[..., Any], name: str) -> dict:
    """What --tune needs to know of the loader it was given: its kind and class, and for a DataLoader the
    arguments it was made with (checked to make it again), for tf.data or a DataFlow the settings its callable
    takes."""
    cls = type(obj)
    info: dict = {"kind": kind, "class": cls.__name__, "type": f"{cls.__module__}.{cls.__qualname__}"}
    if kind == "dataloader":
        rebuild(obj, settings_of(obj), name)  # RebuildError now, not at the first setting
        literal, objects = dataloader_arguments(obj)
        auto = type(obj.sampler).__name__ in _AUTO_SAMPLERS  # made by DataLoader from `shuffle`: not the user's
        kept = sorted(k for k in objects if not (k == "sampler" and auto))
        info.update(arguments=literal, kept=kept, settings=settings_of(obj))
    elif kind in KNOBS:
        info["knobs"] = callable_knobs(fn, kind)
    return info
