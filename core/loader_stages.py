"""Which stage of a loader is slow: the time of each transform, and of the read and the decode, per sample.

For a map-style dataset (a torch `Dataset`, or the one behind a
`DataLoader`) whose `transform` is a list of steps (torchvision's `Compose`,
or anything with a `transforms` list, or a plain list of callables), each
step is wrapped in a timer that returns its step's output unchanged; a
dataset that reads files through torchvision's default loader has that
loader split into the file's read and its decode, producing the same image.
Samples are then taken one by one in this process (no DataLoader workers,
so every timer is seen) and each stage's share of the whole sample is
reported. What no stage covers (the dataset's own code: looking up the path
and the label) is the gap between the shares' sum and 100%.

TensorFlow keeps tf.data's per-op statistics inside its profiler only (no
public API in TensorFlow 2.21), and tensorpack DataFlows and plain iterables
expose no steps to wrap: for those the result carries a note saying so.
"""

from __future__ import annotations

import io
import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from core.loader_spec import DEFAULT_TIMEOUT, LoaderError, LoaderSpec, guarded, kind_of, sample_order, seed_globals

NO_STAGES = {
    "tf.data": "tf.data keeps its per-op statistics inside TensorFlow's profiler only (no public API in "
    "TensorFlow 2.21); open a trace of the pipeline in TensorBoard's input-pipeline analyser",
    "dataflow": "a tensorpack DataFlow exposes no per-step timers; only the whole loader is measured",
    "iterable": "a plain iterable of batches exposes no steps to time; only the whole loader is measured",
}


TIE_Z = 1.96  # a stage within this many standard errors of the slowest one ties with it (95%, two-sided)


class _Timed:
    """A step that adds its own wall time to `acc[name]` and returns exactly what the step returns."""

    def __init__(self, step: Callable, name: str, acc: dict[str, float]) -> None:
        self.step, self.name, self.acc = step, name, acc

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        out = self.step(*a, **kw)
        self.acc[self.name] += time.perf_counter() - t0
        return out

    def __repr__(self) -> str:
        return repr(self.step)


def _read_decode(acc: dict[str, float]) -> Callable[[str], Any]:
    """torchvision's pil_loader in two timed halves: the file's bytes, then PIL's decode to RGB (same image)."""
    from PIL import Image

    def load(path):
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            data = f.read()
        t1 = time.perf_counter()
        img = Image.open(io.BytesIO(data)).convert("RGB")
        t2 = time.perf_counter()
        acc["read"] += t1 - t0
        acc["decode"] += t2 - t1
        return img

    return load


def _names(steps: list) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for s in steps:
        base = type(s).__name__ if not hasattr(s, "__name__") else s.__name__
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return out


def instrument(dataset: Any, acc: dict[str, float]) -> list[str]:
    """Wrap the dataset's read, decode and transform steps in timers; returns the stage names in order."""
    names: list[str] = []
    loader = getattr(dataset, "loader", None)
    if loader is not None and callable(loader):
        if getattr(loader, "__module__", "").startswith("torchvision") and loader.__name__ in (
            "default_loader",
            "pil_loader",
        ):
            from torchvision import get_image_backend

            if get_image_backend() == "PIL":
                dataset.loader = _read_decode(acc)
                names += ["read", "decode"]
        if not names:
            dataset.loader = _Timed(loader, "load (read + decode)", acc)
            names.append("load (read + decode)")
    transform = getattr(dataset, "transform", None)
    holder, steps = None, None
    if isinstance(getattr(transform, "transforms", None), list):
        holder, steps = transform, transform.transforms
    elif isinstance(transform, (list, tuple)) and all(callable(s) for s in transform):
        steps = list(transform)
    if steps is not None:
        step_names = _names(steps)
        wrapped = [_Timed(s, n, acc) for s, n in zip(steps, step_names, strict=True)]
        if holder is not None:
            holder.transforms = wrapped
        else:
            dataset.transform = type(transform)(wrapped)
        names += step_names
    elif transform is not None and callable(transform):
        dataset.transform = _Timed(transform, "transform", acc)
        names.append("transform")
    for n in names:
        acc.setdefault(n, 0.0)
    return names


def profile(
    spec: LoaderSpec, seed: int = 0, samples: int = 200, seconds: float = 3.0, warmup: int = 3,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict:  # fmt: skip
    """Per-stage seconds per sample and shares of the whole, for the loader `spec` builds (or a note).

    A loader that is not built, or a sample that is not taken, within `timeout` seconds is a LoaderError.
    """
    obj = spec.build(seed, 0, 1, timeout=timeout)
    kind = kind_of(obj)
    dataset = getattr(obj, "dataset", None) if kind == "dataloader" else obj if kind == "dataset" else None
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        why = NO_STAGES.get(kind, "the loader exposes no map-style dataset")
        if kind == "dataloader":
            why = "its DataLoader's dataset is not map-style (no steps to time)"
        return {"loader": spec.name, "kind": kind, "stages": [], "note": why}
    return profile_dataset(dataset, spec.name, kind, seed, samples, seconds, warmup, timeout)


def _sample_times(
    dataset: Any, order: list[int], warmup: int, acc: dict[str, float]
) -> Iterator[tuple[float, dict[str, float]]]:
    """The wall time of `dataset[i]` for each index of `order`, and the stages' timers after it (they
    restart after `warmup`)."""
    for k, i in enumerate(order):
        if k == warmup:  # the first samples pay for imports and cold caches
            for name in acc:
                acc[name] = 0.0
        t0 = time.perf_counter()
        dataset[int(i)]
        yield time.perf_counter() - t0, dict(acc)


def tied_with_slowest(per_sample: dict[str, list[float]]) -> list[str]:
    """The slowest stage (most time over the samples), then every stage this many samples cannot tell from it.

    Each sample times every stage, so the two are compared sample by sample: a stage is tied with the
    slowest when the 95% interval of the mean of their paired differences (normal approximation) holds 0.
    One sample gives no spread to judge by: every stage that took time is tied then.
    """
    totals = {name: sum(v) for name, v in per_sample.items()}
    top = max(totals, key=totals.__getitem__)
    out = [top]
    for name, times in per_sample.items():
        if name == top or totals[name] <= 0:
            continue
        d = [a - b for a, b in zip(per_sample[top], times, strict=True)]
        if len(d) < 2 or statistics.mean(d) <= TIE_Z * statistics.stdev(d) / math.sqrt(len(d)):
            out.append(name)
    return sorted(out, key=lambda n: -totals[n])


def profile_dataset(
    dataset: Any, name: str, kind: str = "dataset", seed: int = 0, samples: int = 200, seconds: float = 3.0,
    warmup: int = 3, timeout: float = DEFAULT_TIMEOUT,
) -> dict:  # fmt: skip
    """Time `dataset[i]` for random indices, each instrumented stage inside it, and their shares.

    Samples are taken on a helper thread (`guarded`): one that raises or hangs is one LoaderError.
    """
    acc: dict[str, float] = {}
    names = instrument(dataset, acc)
    if not names:
        return {"loader": name, "kind": kind, "stages": [], "note": "the dataset has no transform or loader to time"}
    if len(dataset) <= 0:
        raise LoaderError(f"loader {name}: its dataset is empty (len 0): no samples to time")
    seed_globals(seed)
    order = list(itertools.islice(sample_order(np.random.default_rng(seed), len(dataset)), warmup + samples))
    times = guarded(_sample_times(dataset, order, warmup, acc), name, timeout, unit="sample", ahead=0,
                    prepare=lambda t: t)  # fmt: skip
    whole, n = 0.0, 0
    end = None
    per_sample: dict[str, list[float]] = {s: [] for s in names}
    before = dict.fromkeys(names, 0.0)
    for k, (t, after) in enumerate(times):
        if k < warmup:
            continue
        end = end or time.monotonic() + seconds
        whole += t
        n += 1
        for s in names:
            per_sample[s].append(after[s] - before[s])
        before = after
        if time.monotonic() > end:
            break
    times.close()
    per = whole / n
    stages = [{"name": s, "seconds_per_sample": acc[s] / n, "share": acc[s] / whole} for s in names]
    shares = sum(s["share"] for s in stages)
    tied = tied_with_slowest(per_sample)
    source = "torchvision transforms" if kind in ("dataloader", "dataset") else kind
    return {
        "loader": name,
        "kind": kind,
        "source": f"{source}, timed one sample at a time in one process",
        "samples": n,
        "seconds_per_sample": per,
        "stages": stages,
        "shares_sum": shares,
        "unaccounted_share": 1.0 - shares,
        "slowest": slowest_words(stages, shares, per, tied, n),
        "tied_with_slowest": tied[1:],
    }


# What no stage covers: the dataset's own code around its loader and transforms.
UNACCOUNTED = "the dataset's own code outside the listed stages (its __getitem__ around them)"


def limiting(stages: list[dict], shares_sum: float, per_sample: float) -> dict:
    """The part of a sample's time that limits it: the stage with the largest share, or, where the time outside
    every listed stage is larger than that, the unaccounted part (`{"name": UNACCOUNTED, ...}`)."""
    top = max(stages, key=lambda s: s["share"])
    rest = max(0.0, 1.0 - shares_sum)
    if rest <= top["share"]:
        return top
    return {"name": UNACCOUNTED, "share": rest, "seconds_per_sample": per_sample * rest}


def slowest_words(stages: list[dict], shares_sum: float, per_sample: float, tied: list[str], samples: int) -> str:
    """`decode (61% of a sample)`; the stages that tie for it (`tied`: which of them is slowest is within the
    noise of `samples` samples); or, where the listed stages explain less than the time outside them, that."""
    top = limiting(stages, shares_sum, per_sample)
    if top["name"] != UNACCOUNTED:
        share = {s["name"]: s["share"] for s in stages}
        if len(tied) < 2:
            return f"{top['name']} ({100 * top['share']:.0f}% of a sample)"
        each = [f"{n} ({100 * share[n]:.1f}%)" for n in tied]
        return f"{', '.join(each[:-1])} and {each[-1]} of a sample: a tie, not told apart by {samples} samples"
    return (
        f"none of the listed stages: they explain {100 * shares_sum:.1f}% of a sample's {1e3 * per_sample:.2f} ms; "
        f"{100 * top['share']:.1f}% ({1e3 * per_sample * top['share']:.2f} ms) is {UNACCOUNTED}"
    )
