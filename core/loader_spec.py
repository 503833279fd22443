"""A user's own loader as an input: `--loader MODULE:CALLABLE` and `--loader-arg key=value`.

The callable returns one of:

- an iterable of `(images, labels)` batches (numpy arrays or torch tensors), or of single samples;
- a map-style torch `Dataset` of `(image, label)` samples (batched here);
- a torch `DataLoader`;
- a `tf.data.Dataset` (its numpy iterator is used);
- a tensorpack `DataFlow` (reset, then iterated).

Whatever it is, `batches` turns it into an iterator of `(uint8 NHWC images,
int32 labels)` numpy batches, checked against what the model takes; a
loader that yields anything else, raises, or stops yielding gets one line
that names the loader and the problem (`LoaderError`).

Framework-neutral: torch and TensorFlow are only ever touched through the
objects the user's callable returns (recognised by their type's module), so
importing this module imports neither.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import os
import queue
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core import loader_processes, loader_settings, loader_start
from core.errors import FeedbenchError

DEFAULT_TIMEOUT = 60.0  # seconds a loader may take for one batch (the first included) before it is called hung


class LoaderError(FeedbenchError):
    """The user's loader cannot be used as it is; the message names the loader and says what to change."""


def is_file_target(module_text: str) -> bool:
    """True when the MODULE part of --loader names a file (a path, or a name ending in .py) rather than a module."""
    return module_text.endswith(".py") or os.sep in module_text or os.path.isfile(module_text)


def absolute_target(target: str, project_relative: bool = True) -> str:
    """--loader with its file made absolute, so processes started in another folder find the same file; one in
    the project's folder is kept as typed (`project_relative`) for processes that start there (producers,
    ranks), not for those that do not (Ray's workers)."""
    module, sep, name = target.rpartition(":")
    if not (sep and module and is_file_target(module) and os.path.isfile(module)):
        return target
    path = os.path.abspath(module)
    if project_relative and path == os.path.abspath(os.path.join(PROJECT, module)):
        return target  # the same file from the project's folder: kept as typed
    return f"{path}:{name}"


def parse_args(texts: list[str] | tuple[str, ...] | None) -> tuple[tuple[str, Any], ...]:
    """`key=value` pairs; a value is a Python literal (`8`, `0.5`, `True`, `'x'`) or else the text itself."""
    out = []
    for text in texts or ():
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise LoaderError(f"--loader-arg {text!r}: expected key=value, e.g. --loader-arg batch_size=32")
        value = _literal(key, raw)
        out.append((key, value))
    return tuple(out)


MAX_ARG_CHARS = 10_000  # a --loader-arg value longer than this is refused, not parsed
MAX_ARG_DEPTH = 32  # nor one nested deeper: ast.literal_eval would run out of memory or recursion


def _literal(key: str, raw: str) -> Any:
    """The value as a Python literal where it is one, else the text itself; bounded in size and depth."""
    if len(raw) > MAX_ARG_CHARS:
        raise LoaderError(f"--loader-arg {key}: {len(raw)} characters; at most {MAX_ARG_CHARS}")
    depth = deepest = 0
    for c in raw:
        depth += c in "([{"
        depth -= c in ")]}"
        deepest = max(deepest, depth)
    if deepest > MAX_ARG_DEPTH:
        raise LoaderError(f"--loader-arg {key}: nested {deepest} deep; at most {MAX_ARG_DEPTH}")
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


@dataclass(frozen=True)
class LoaderSpec:
    """Which callable makes the loader and with what keyword arguments; picklable, built in each worker."""

    target: str  # "path/to/file.py:make" or "package.module:make"
    args: tuple[tuple[str, Any], ...] = field(default=())
    # --tune: the DataLoader it returns is made again with these (core/loader_settings.py `rebuild`)
    settings: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def parse(cls, target: str, arg_texts: list[str] | tuple[str, ...] | None = None) -> LoaderSpec:
        module, sep, name = target.rpartition(":")
        if not sep or not module or not name.isidentifier():
            raise LoaderError(
                f"--loader {target!r}: expected MODULE:CALLABLE, e.g. examples/torchvision_imagefolder.py:make_loader"
            )
        return cls(target, parse_args(arg_texts))

    @property
    def name(self) -> str:
        return self.target

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)

    def resolve(self) -> Callable[..., Any]:
        """Import the module (a file path or an importable name) and return the callable."""
        module_text, _, attr = self.target.rpartition(":")
        if is_file_target(module_text):
            mod = self._import_file(module_text)
        else:
            try:
                mod = importlib.import_module(module_text)
            except ModuleNotFoundError as e:
                raise LoaderError(f"loader {self.name}: cannot import {module_text} ({e})") from None
            except (Exception, SystemExit) as e:
                words = exception_words(e)
                raise LoaderError(f"loader {self.name}: importing {module_text} raised {words}") from None
        loader_start.note_imported()  # the threads its imports started (core/loader_start.py)
        return self._attr(mod, module_text, attr)

    def _import_file(self, module_text: str) -> Any:
        """The loader's file as a module, imported once per process whatever its suffix.

        Importable by its plain name where that is free and its folder shadows
        none of the project's packages, so that spawned processes of the loader
        (which unpickle its classes by module name) find it through sys.path,
        which they inherit; the folder goes after the project's.
        """
        path = os.path.abspath(module_text)
        if not os.path.isfile(path):
            raise LoaderError(f"loader {self.name}: no such file {module_text}")
        for mod in list(sys.modules.values()):
            if getattr(mod, "__file__", None) == path:
                return mod
        stem = os.path.splitext(os.path.basename(path))[0]
        folder = os.path.dirname(path)
        mod_name = stem
        # Another module of that name is in the way; this very file, found through a folder an earlier
        # import put on sys.path (which spawned processes inherit), is not.
        found = importlib.util.find_spec(stem) if stem.isidentifier() and stem not in sys.modules else None
        theirs = found is not None and os.path.abspath(found.origin or "") != path
        if not stem.isidentifier() or stem in sys.modules or theirs:
            mod_name = "feedbench_loader_" + "".join(c if c.isalnum() else "_" for c in stem)
        elif folder not in sys.path and not _shadows_project(folder):
            sys.path.append(folder)
        loader = importlib.machinery.SourceFileLoader(mod_name, path)
        spec = importlib.util.spec_from_file_location(mod_name, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod  # dataclasses and pickling look the module up by name
        try:
            loader.exec_module(mod)
        except (Exception, SystemExit) as e:
            sys.modules.pop(mod_name, None)
            raise LoaderError(f"loader {self.name}: importing {module_text} raised {exception_words(e)}") from None
        return mod

    def _attr(self, mod: Any, module_text: str, attr: str) -> Callable[..., Any]:
        fn = getattr(mod, attr, None)
        if fn is None:
            raise LoaderError(f"loader {self.name}: {module_text} has no {attr}")
        if not callable(fn):
            raise LoaderError(f"loader {self.name}: {attr} in {module_text} is not callable")
        return fn

    def build(
        self, seed: int = 0, worker: int = 0, num_workers: int = 1, offer: dict | None = None,
        timeout: float | None = None, context: Callable[[], Any] | None = None,
    ) -> Any:  # fmt: skip
        """Call the loader's callable: its own copy, seeded with this worker's shard of the seed.

        The callable gets `seed`, `shard` (this worker's index) and `num_shards`
        when it takes them (so it can shard its data), and what `offer` holds (the run's
        `batch_size` and `image_size`) where it takes those and --loader-arg
        did not set them; Python's, numpy's and torch's global generators are
        seeded with `seed` either way. With `timeout`, an import or a call that
        has not returned after that many seconds is a LoaderError (it runs on
        a helper thread, inside `context()` where given: a TensorFlow graph).
        """
        before = loader_processes.snapshot()
        try:
            if timeout is None:
                return self._build(seed, worker, num_workers, offer)
            what = "importing and calling it"
            return within(timeout, self.name, what, lambda: self._build(seed, worker, num_workers, offer), context)
        finally:
            loader_processes.note_built(before)  # the processes the callable started (a cache server)

    def _build(self, seed: int, worker: int, num_workers: int, offer: dict | None) -> Any:
        fn = self.resolve()
        kwargs = self.kwargs
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        for key, value in (("seed", seed), ("shard", worker), ("num_shards", num_workers)):
            if key not in kwargs and key in params:
                kwargs[key] = value
        for key, value in (offer or {}).items():
            if value is not None and key not in kwargs and key in params:
                kwargs[key] = value
        seed_globals(seed)
        try:
            return fn(**kwargs)
        except TypeError as e:
            raise LoaderError(
                f"loader {self.name}: calling it with {_kw_words(kwargs)} raised {exception_words(e)}"
            ) from None
        except (Exception, SystemExit) as e:
            raise LoaderError(f"loader {self.name}: calling it raised {exception_words(e)}") from None


def within(
    timeout: float, name: str, what: str, fn: Callable[[], Any], context: Callable[[], Any] | None = None
) -> Any:
    """`fn()` on a daemon helper thread, so that a loader that never returns is one LoaderError after `timeout` s.

    The thread is left behind in the loader's code (it cannot be stopped);
    the process that gets the error exits, and takes it along.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            with context() if context is not None else contextlib.nullcontext():
                box["value"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="feedbench-loader-build", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise LoaderError(
            f"loader {name}: {what} has not returned after {timeout:g} s (hung? raise --loader-timeout if it is "
            "only slow)"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shadows_project(folder: str) -> bool:
    """True when `folder` holds a module or package named like one of the project's (core.py, wire/...)."""
    try:
        theirs = {entry.split(".")[0] for entry in os.listdir(folder)}
    except OSError:
        return True
    ours = {entry.split(".")[0] for entry in os.listdir(PROJECT) if not entry.startswith(".")}
    return bool(theirs & ours)


def allow_children() -> None:
    """Let a loader in a worker process start processes of its own (a DataLoader's workers).

    Producer workers are daemonic, so that they never outlive their producer,
    and multiprocessing forbids children to daemonic processes. The worker
    still dies with its parent (PR_SET_PDEATHSIG); its own children are
    daemonic, so multiprocessing stops them when the worker exits.
    """
    import multiprocessing as mp

    proc = mp.current_process()
    if proc.daemon and getattr(proc, "_popen", None) is None:
        proc.daemon = False
    # A spawned worker inherits "spawn"; the loader's own processes start as in the user's script
    # (the platform's default: fork on Linux), which also needs no importable main module.
    default = mp.get_all_start_methods()[0]
    if mp.get_start_method(allow_none=True) != default:
        mp.set_start_method(default, force=True)


WORKER_LOG_ENV = "FEEDBENCH_WORKER_LOG"  # a file each DataLoader worker appends "pid id began ready" to


def _dataloader_worker_init(user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """A DataLoader worker forked from feedbench takes SIGTERM and SIGINT the default way.

    It would otherwise inherit the handlers (and the blocked mask) of the
    process that forked it, a producer worker or a trainer, and so ignore the
    SIGTERM its DataLoader sends it at exit. Where WORKER_LOG_ENV names a
    file (--epochs), it notes there when it began and when it was ready.
    """
    import signal

    began = time.monotonic()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the DataLoader stops its workers
    if user_init is not None:
        user_init(worker_id)
    log = os.environ.get(WORKER_LOG_ENV)
    if log:  # --epochs: when this worker began and became ready (CLOCK_MONOTONIC, the same in every process)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {worker_id} {began!r} {time.monotonic()!r}\n")


def prepare_dataloader(loader: Any) -> Any:
    """Give a DataLoader's workers default signal handling, keeping the user's worker_init_fn."""
    import functools

    init = loader.worker_init_fn
    if not (isinstance(init, functools.partial) and init.func is _dataloader_worker_init):
        loader.worker_init_fn = functools.partial(_dataloader_worker_init, init)
    return loader


def seed_globals(seed: int) -> None:
    """Seed the generators a loader is likely to draw from (torch only if the loader imported it)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


_FRAME = re.compile(r'\s*File "(.+)", line (\d+), in (.+)$')


def exception_words(e: BaseException) -> str:
    """An exception in one line; one re-raised from a DataLoader worker keeps the worker's own cause."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if "Original Traceback (most recent call last):" in lines[1:2]:
        # PyTorch's worker error: "Caught X in DataLoader worker process N." then the worker's traceback.
        frames = [m.groups() for ln in lines if (m := _FRAME.match(ln))]
        own = [f for f in frames if not re.search(r"[/\\](site|dist)-packages[/\\]", f[0])] or frames
        where = f" (at {own[-1][0]}:{own[-1][1]} in {own[-1][2]})" if own else ""
        return f"{text.removeprefix('Caught ').rstrip('.')}: {lines[-1].strip()}{where}"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _kw_words(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"


# --------------------------------------------------------------------------- what the callable returned


def _module_of(obj: Any) -> str:
    return type(obj).__module__ or ""


# What a loader's callable returned, in the words of a path that cannot take it (`kind_of`'s kinds).
KIND_WORDS = {
    "dataloader": "a torch DataLoader",
    "dataset": "a map-style dataset",
    "tf.data": "a tf.data.Dataset",
    "dataflow": "a tensorpack DataFlow",
    "iterable": "an iterable (a generator or the like)",
}
# Where a loader a path refuses can run instead: the paths that take every kind.
ELSEWHERE = "run this loader as producers (--fake-location zmq-consume) or inside the trainer (--fake-location loader)"


def returned_words(obj: Any) -> str:
    """What `obj`, a loader's callable's return, is, for a refusal: "a torch DataLoader", "a list"."""
    return KIND_WORDS.get(kind_of(obj), "a " + type(obj).__name__)


def kind_of(obj: Any) -> str:
    """What the loader returned: dataloader, dataset (map-style torch), tf.data, dataflow, or iterable."""
    mro = [c.__module__ + "." + c.__name__ for c in type(obj).__mro__]
    if "torch.utils.data.dataloader.DataLoader" in mro:
        return "dataloader"
    if any(m.startswith("tensorflow.") and m.endswith("DatasetV2") for m in mro):
        return "tf.data"
    if any(m.startswith("tensorpack.") and m.endswith(".DataFlow") for m in mro):
        return "dataflow"
    if "torch.utils.data.dataset.Dataset" in mro and "torch.utils.data.dataset.IterableDataset" not in mro:
        return "dataset"
    if hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not isinstance(obj, (list, tuple, np.ndarray)):
        return "dataset"  # map-style without torch: samples by index
    if hasattr(obj, "__iter__") or hasattr(obj, "__next__"):
        return "iterable"
    return "unknown"


def _to_numpy(x: Any) -> Any:
    """A torch tensor, a TensorFlow eager tensor or a PIL image as numpy; anything else unchanged."""
    if isinstance(x, np.ndarray):
        return x
    mod = _module_of(x)
    if mod.startswith("torch"):
        return x.detach().cpu().numpy()
    if mod.startswith("tensorflow") and hasattr(x, "numpy"):
        return x.numpy()
    if mod.startswith("PIL"):
        return np.asarray(x)
    if isinstance(x, (int, np.integer, float, np.floating)):
        return np.asarray(x)
    return x


def _pair(item: Any) -> tuple[Any, Any] | None:
    """(images, labels) from a batch or sample: a tuple or list of two or more, or a dict with image/label keys."""
    if isinstance(item, dict):
        img = next((item[k] for k in ("images", "image", "img", "x", "data") if k in item), None)
        lab = next((item[k] for k in ("labels", "label", "y", "target", "targets") if k in item), None)
        return (img, lab) if img is not None and lab is not None else None
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[0], item[1]
    return None


def _epochs(name: str, new_pass: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """Pass after pass over a finite loader (a DataLoader's epoch ends; training starts the next one)."""
    while True:
        empty = True
        for item in new_pass():
            empty = False
            yield item
        if empty:
            raise LoaderError(f"loader {name}: yields no batches (is its data folder empty, or drop_last too strict?)")


SHUFFLE_MAX = 1 << 24  # a dataset up to this long is taken in a fresh permutation each pass


def sample_order(rng: np.random.Generator, n: int) -> Iterator[int]:
    """Indices of a map-style dataset of `n` samples, for ever: a permutation per pass while that fits in
    memory, else indices drawn at random (a dataset of 10**12 samples has no permutation to hold)."""
    while True:
        if n <= SHUFFLE_MAX:
            yield from rng.permutation(n)
        else:
            yield from rng.integers(0, n, size=SHUFFLE_MAX)


def passes(
    obj: Any, kind: str, seed: int, name: str, rebuild: Callable[[], Any], lazy: bool = False
) -> Callable[[], Iterator[Any]]:
    """What begins one pass (an epoch) over the loader: each call starts a new pass and returns its iterator.

    A re-iterable object (a DataLoader, a tf.data.Dataset, a DataFlow, a list)
    is passed over again and again; a map-style dataset in a fresh order (`sample_order`)
    each pass. An iterator or generator is one pass: when it ends, `rebuild()`
    (calling the loader again) gives the next, as a training loop calls it per
    epoch. With `lazy`, nothing starts before the first call (a DataFlow's
    reset_state(), which starts its processes, is part of the first pass), so
    each pass's start can be timed; else a DataFlow is reset and a DataLoader
    iterated now, and what they raise is raised here.
    """
    if kind == "tf.data":
        return obj.as_numpy_iterator
    if kind == "dataflow":
        done = [] if lazy else [obj.reset_state()]

        def dataflow_pass() -> Iterator[Any]:
            if not done:
                done.append(obj.reset_state())
            return iter(obj)

        return dataflow_pass
    if kind == "dataset":
        n = dataset_length(obj, name)
        rng = np.random.default_rng(seed)
        return lambda: (obj[int(i)] for i in itertools.islice(sample_order(rng, n), n))  # an epoch: n samples
    if kind == "dataloader" and lazy:
        return lambda: iter(obj)
    first = iter(obj)
    if first is obj:  # an iterator or a generator: one pass, then a new call per pass
        calls = itertools.chain([first], (iter(rebuild()) for _ in itertools.count()))
        return lambda: next(calls)
    again = itertools.chain([first], iter(lambda: iter(obj), None))
    return lambda: next(again)


def dataset_length(obj: Any, name: str) -> int:
    """A map-style dataset's length; an empty one is refused (no samples to batch)."""
    n = len(obj)
    if n <= 0:
        raise LoaderError(f"loader {name}: its dataset is empty (len {n}): no samples to batch")
    return n


def raw_iterator(obj: Any, kind: str, seed: int, name: str, rebuild: Callable[[], Any]) -> Iterator[Any]:
    """The items the returned object yields, each a batch or a sample (not yet converted), pass after pass.

    A map-style dataset is read in a seeded random order for ever (see
    `sample_order`); every other loader pass after pass (`passes`).
    """
    if kind == "dataset":
        n = dataset_length(obj, name)
        rng = np.random.default_rng(seed)
        return (obj[int(i)] for i in sample_order(rng, n))
    return _epochs(name, passes(obj, kind, seed, name, rebuild))


class Batcher:
    """Turns the loader's items into checked `(uint8 NHWC, int32)` numpy batches of one shape.

    Items that are single samples (an HWC image and a scalar label) are stacked
    `batch` at a time; items that are batches pass through. The first batch is
    checked against the model's signature (`expect`: batch, image size, each
    None to take the loader's), every later one against the first.
    """

    def __init__(self, name: str, batch: int, expect_batch: int | None, expect_size: int | None) -> None:
        self.name = name
        self.batch = batch
        self.expect_batch = expect_batch
        self.expect_size = expect_size
        self.shape: tuple[int, ...] | None = None
        self.count = 0  # batches yielded so far

    def fail(self, what: str) -> LoaderError:
        return LoaderError(f"loader {self.name}: batch {self.count + 1}: {what}")

    def arrays(self, item: Any) -> tuple[np.ndarray, Any]:
        """An item's (images, labels), the images as numpy; LoaderError saying what the item is otherwise."""
        pair = _pair(item)
        if pair is None:
            raise self.fail(
                f"yields {type(item).__name__}; expected (images, labels) pairs (a tuple, a list, "
                "or a dict with 'image' and 'label')"
            )
        img, lab = _to_numpy(pair[0]), _to_numpy(pair[1])
        if not isinstance(img, np.ndarray):
            raise self.fail(f"images are {type(img).__name__}; expected numpy arrays or torch tensors")
        return img, lab

    def batches(self, items: Iterator[Any]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        pending_img: list[np.ndarray] = []
        pending_lab: list[Any] = []
        for item in items:
            img, lab = self.arrays(item)
            if img.ndim == 3 and np.ndim(lab) == 0:  # one sample: batch it here
                pending_img.append(img)
                pending_lab.append(lab)
                if len(pending_img) < self.batch:
                    continue
                if len({a.shape for a in pending_img}) > 1:
                    shapes = sorted({a.shape for a in pending_img})
                    raise self.fail(f"samples of different shapes {shapes[0]} and {shapes[-1]} cannot be batched")
                img, lab = np.stack(pending_img), np.asarray(pending_lab)
                pending_img, pending_lab = [], []
            yield self.check(img, np.asarray(lab))
            self.count += 1

    def check(self, images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Refuse what the model cannot take, with what to change; labels become int32."""
        if self.shape is not None:
            if images.shape != self.shape or images.dtype != np.uint8:
                raise self.fail(
                    f"images are {images.dtype} {tuple(images.shape)} after batches of uint8 {self.shape}; "
                    "every batch must have one shape (drop_last=True drops a short last batch)"
                )
        else:
            self._check_first(images)
        if labels.ndim != 1 or len(labels) != len(images):
            raise self.fail(
                f"labels have shape {tuple(labels.shape)}; expected one integer label per image ({len(images)},)"
            )
        if not np.issubdtype(labels.dtype, np.integer):
            raise self.fail(f"labels are {labels.dtype}; expected integers (class indices)")
        self.shape = tuple(images.shape)
        return np.ascontiguousarray(images), labels.astype(np.int32, copy=False)

    def _check_first(self, images: np.ndarray) -> None:
        shape = tuple(images.shape)
        if np.issubdtype(images.dtype, np.floating):
            raise self.fail(
                f"images are {images.dtype} {shape}; the model takes uint8 NHWC (0-255) and normalises on the "
                "device: drop ToTensor()/Normalize() (torchvision: PILToTensor() or np.asarray), or convert with "
                "(x * 255).round().to(torch.uint8) / tf.cast(x * 255, tf.uint8)"
            )
        if images.dtype != np.uint8:
            raise self.fail(f"images are {images.dtype} {shape}; the model takes uint8 NHWC: cast them to uint8")
        if images.ndim != 4:
            raise self.fail(f"images have shape {shape}; expected a batch of HWC images (N, H, W, 3)")
        if images.shape[-1] != 3:
            if images.shape[1] == 3:
                raise self.fail(
                    f"images are NCHW {shape}; the model takes NHWC: x.permute(1, 2, 0) in a per-sample transform, "
                    "x.permute(0, 2, 3, 1) on a batch (numpy: transpose with the same axes)"
                )
            raise self.fail(f"images have shape {shape}; expected 3 channels last (N, H, W, 3)")
        n, h, w, _ = shape
        if n == 0:
            raise self.fail(f"images have shape {shape}: a batch of no images (an empty shard, or a batch_size of 0?)")
        if h != w:
            raise self.fail(f"images are {h}x{w}; the model takes square images (crop or resize to SxS)")
        if self.expect_size is not None and h != self.expect_size:
            raise self.fail(
                f"images are {h}x{w}; the run's model takes {self.expect_size}x{self.expect_size} "
                f"(pass --image-size {h}, or resize in the loader)"
            )
        if self.expect_batch is not None and n != self.expect_batch:
            raise self.fail(
                f"batches hold {n} images; the run's model takes {self.expect_batch} per batch "
                f"(pass --batch {n}, or set the loader's batch size)"
            )


_END = object()


def own(item: Any) -> Any:
    """The item's images and labels as numpy arrays of our own: a copy, never the loader's memory.

    A loader may refill one preallocated buffer for every batch (a common
    reader pattern); a batch still queued for sending, or prefetched, would
    then change under its consumer. An item that is not an (images, labels)
    pair is left for the Batcher to refuse.
    """
    pair = _pair(item)
    if pair is None:
        return item
    return tuple(np.array(_to_numpy(x), order="C", copy=True) for x in pair)


def guarded(
    items: Iterator[Any],
    name: str,
    timeout: float,
    should_stop: Callable[[], bool] = lambda: False,
    unit: str = "batch",
    ahead: int = 2,
    prepare: Callable[[Any], Any] = own,
) -> Iterator[Any]:
    """`items`, taken in a helper thread so that a loader that hangs or raises becomes one LoaderError.

    The thread reads at most `ahead` items ahead of the consumer, each made
    the consumer's own by `prepare` (a copy) before the loader is asked for
    the next: a loader that reuses its output buffer cannot change a batch
    that was already handed on. `ahead=0` asks the loader for an item only
    when the consumer asks for it. A loader that yields nothing for
    `timeout` seconds is called hung; its thread is a daemon, so the process
    can still exit (and multiprocessing stops a DataLoader's daemonic
    workers at exit).
    """
    q: queue.Queue = queue.Queue()
    credits = threading.Semaphore(ahead)  # one more for every item the consumer asks for
    done = threading.Event()

    t = threading.Thread(target=_pump, args=(items, q, credits, done, prepare), name="feedbench-loader", daemon=True)
    t.start()
    got = 0
    try:
        while True:
            credits.release()
            item, err = _take(q, name, unit, got, timeout, should_stop)
            if err is not None:
                index, e = err
                if isinstance(e, LoaderError):
                    raise e
                raise LoaderError(f"loader {name}: {unit} {index} raised {exception_words(e)}") from None
            if item is _END or item is None:
                return
            got += 1
            yield item
    finally:
        done.set()
        # Let the thread leave the loader's code before the process may exit: a thread killed at
        # interpreter exit inside native code (TensorFlow's, say) aborts the process.
        t.join(min(timeout, 10.0))


def _pump(
    items: Iterator[Any],
    q: queue.Queue,
    credits: threading.Semaphore,
    done: threading.Event,
    prepare: Callable[[Any], Any],
) -> None:
    """guarded's thread: one item per credit, made the consumer's own, then (_END, error or None) at the end."""
    n = 0
    try:
        while True:
            while not credits.acquire(timeout=0.1):
                if done.is_set():
                    return
            if done.is_set():
                return
            item = next(items, _END)
            if item is _END:
                break
            n += 1
            q.put((prepare(item), None))
        q.put((_END, None))
    except BaseException as e:  # reported by the consumer of the queue as one line
        q.put((_END, (n + 1, e)))


def _take(
    q: queue.Queue, name: str, unit: str, got: int, timeout: float, should_stop: Callable[[], bool]
) -> tuple[Any, Any]:
    """The pump's next (item, error); (None, None) when `should_stop()`; LoaderError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return q.get(timeout=0.1)
        except queue.Empty:
            if should_stop():
                return None, None
            if time.monotonic() > deadline:
                raise LoaderError(
                    f"loader {name}: no {unit} for {timeout:g} s after {unit} {got} "
                    "(hung? raise --loader-timeout if it is only slow)"
                ) from None


def batches(
    spec: LoaderSpec,
    batch: int = 64,
    expect_batch: int | None = None,
    expect_size: int | None = None,
    seed: int = 0,
    worker: int = 0,
    num_workers: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The loader's batches as checked numpy arrays; `batch` is the size for loaders that yield samples.

    A generator: the loader is built at the first `next()`, and when the
    generator is closed (or collected) the processes the loader started (a
    DataLoader's workers) are stopped with it.
    """
    import multiprocessing as mp

    before = {p.pid for p in mp.active_children()}
    offer = {"batch_size": expect_batch, "image_size": expect_size}
    obj, kind, rebuild = made(spec, seed, worker, num_workers, offer, timeout)
    try:
        items = raw_iterator(obj, kind, seed, spec.name, rebuild)
    except LoaderError:
        raise
    except Exception as e:
        raise LoaderError(f"loader {spec.name}: starting its {kind} raised {exception_words(e)}") from None
    batcher = Batcher(spec.name, expect_batch or batch, expect_batch, expect_size)
    unit = "sample" if kind == "dataset" else "batch"
    out = batcher.batches(guarded(items, spec.name, timeout, should_stop, unit))
    try:
        yield from out
    finally:
        out.close()
        del items, obj
        stop_children(before)


def made(
    spec: LoaderSpec, seed: int, worker: int, num_workers: int, offer: dict, timeout: float
) -> tuple[Any, str, Callable[[], Any]]:
    """(the loader's object, its kind, a call that makes it again) in a process that may start its own.

    What it returned must be something feedbench can iterate; a DataLoader's
    workers get default signal handling (`prepare_dataloader`).
    """
    allow_children()
    obj = spec.build(seed, worker, num_workers, offer, timeout=timeout)
    kind = kind_of(obj)
    if kind == "unknown":
        raise LoaderError(
            f"loader {spec.name}: returned {type(obj).__name__}; expected an iterable of (images, labels) batches, "
            "a torch Dataset or DataLoader, a tf.data.Dataset or a tensorpack DataFlow"
        )
    if spec.settings:
        if kind != "dataloader":
            raise LoaderError(f"loader {spec.name}: returned a {kind}, not a DataLoader whose settings --tune sets")
        obj = loader_settings.rebuild(obj, dict(spec.settings), spec.name)
    if kind == "dataloader":
        prepare_dataloader(obj)
    return obj, kind, lambda: spec.build(seed, worker, num_workers, offer, timeout=timeout)


def stop_children(keep: set[int]) -> None:
    """Stop the multiprocessing children not in `keep` (the ones a loader started), quietly.

    A DataLoader that is not shut down leaves its workers to multiprocessing's
    exit handler, and its SIGCHLD handler then reports their ends as failures.
    """
    import multiprocessing as mp
    import signal

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    mine = [p for p in mp.active_children() if p.pid not in keep]
    loader_processes.note_stopping([p.pid for p in mine])
    for p in mine:
        p.terminate()
    for p in mine:
        p.join(2)
        if p.is_alive():
            p.kill()
            p.join()


def worker_seed(seed: int, producer_id: int) -> int:
    """Worker `producer_id`'s shard of the seed: every worker of every producer draws differently."""
    return seed * 100_003 + producer_id
