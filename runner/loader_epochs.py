"""`bench_input.py --loader M:F --loader-only --epochs N`: one copy of the loader across N whole epochs.

What a training loop sees at every epoch's start: how long the first batch
takes, how much of that is the loader's worker processes starting, and how
the rate dips across the change of epoch. The loader runs in a fresh process
(as `--loader-only`'s sweep runs it), which makes it, then takes N whole
passes over it one batch at a time, as a training loop asks for them, and
sends back each pass's clock readings: when the pass began (`iter()`), when
that call returned, when each batch arrived and when the pass ended. Each
DataLoader worker notes when it began and when it was ready (its
worker_init_fn done) in a file (core/loader_spec.py `WORKER_LOG_ENV`).

A torch DataLoader with worker processes runs twice, each in a fresh
process: as the loader makes it, and with `persistent_workers` the other way,
so the report shows what persistent workers save. profiler/epoch_report.py
turns the readings into figures.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from core import loader_start
from core.loader_spec import WORKER_LOG_ENV, Batcher, LoaderError, LoaderSpec, guarded, made, passes, stop_children
from profiler.timeline import Timeline
from profiler.timeline import out_files as timeline_files
from profiler.uncertainty import STEP_BATCHES, not_measured, window_rate
from runner import shutdown
from runner.loader_only import (
    LOADER_STAGE,
    Options,
    in_worker,
    messages,
    print_and_write,
    private_tmpdir,
    stop_trees,
)

INFINITE = -1  # tf.data's cardinality of a dataset that repeats for ever (tf.data.INFINITE_CARDINALITY)


def timed_passes(
    opts: Options, epochs: int, persistent: bool | None, should_stop: Callable[[], bool]
) -> Iterator[tuple[str, dict]]:
    """("loader", what it is), then ("epoch", its clock readings) per pass: runs in the epoch process.

    `persistent`: None keeps the DataLoader's own `persistent_workers`; True or False sets it.
    """
    spec = opts.spec
    obj, kind, rebuild = made(spec, opts.seed, 0, 1, {}, opts.timeout)
    info: dict = {"kind": kind, "num_workers": None, "persistent_workers": None, "as_given": True}
    if kind == "dataloader":
        info["num_workers"] = obj.num_workers
        info["persistent_workers"] = bool(obj.persistent_workers)
        if persistent is not None and obj.num_workers > 0 and persistent != obj.persistent_workers:
            object.__setattr__(obj, "persistent_workers", persistent)  # DataLoader refuses it once made
            info.update(persistent_workers=persistent, as_given=False)
    limit = epoch_length(obj, kind, spec.name)
    yield "loader", info
    begin = passes(obj, kind, opts.seed, spec.name, rebuild, lazy=True)
    batcher = Batcher(spec.name, opts.batch, None, None)
    unit = "sample" if kind == "dataset" else "batch"
    for epoch in range(1, epochs + 1):
        start = time.monotonic()
        items = begin()
        began = time.monotonic()
        if limit is not None:  # the epoch ends there; the pass goes on unseen
            items = itertools.islice(items, limit)
        times, images = [], []
        # ahead=0: the loader is asked for a batch only when the loop wants one, as a training loop does.
        for batch, _ in batcher.batches(guarded(items, spec.name, opts.timeout, should_stop, unit, ahead=0)):
            times.append(time.monotonic())
            images.append(len(batch))
        end = time.monotonic()
        if should_stop():
            return
        if not times:
            raise LoaderError(f"loader {spec.name}: epoch {epoch} yielded no batches (an empty or exhausted loader?)")
        yield "epoch", {"start": start, "began": began, "times": times, "images": images, "end": end}
    # The last pass's iterator (a persistent DataLoader's keeps its workers) shuts its workers down as it goes.
    del items, begin, obj
    gc.collect()


def epoch_length(obj: Any, kind: str, name: str) -> int | None:
    """Items (batches or samples) in an epoch where the pass would not end; None where the pass's end is the epoch's.

    A DataFlow's epoch is len(df) datapoints, as tensorpack's trainers count it (its multiprocess runners
    yield for ever). A tf.data.Dataset that repeats for ever has no epochs to measure: refused.
    """
    if kind == "dataflow":
        try:
            return len(obj)
        except (NotImplementedError, TypeError):
            return None
    if kind == "tf.data" and int(obj.cardinality()) == INFINITE:
        raise LoaderError(
            f"loader {name}: its tf.data.Dataset repeats for ever (.repeat()): --epochs needs epochs that end; "
            "leave out .repeat() (a training loop starts each epoch itself)"
        )
    return None


def _epoch_process(
    opts: Options, epochs: int, persistent: bool | None, status: Connection, stop, first_id: int, log: str
) -> None:
    """The epoch process: the loader's passes, their readings sent to the parent; its errors as one line."""

    def body() -> None:
        os.environ[WORKER_LOG_ENV] = log  # the DataLoader's workers inherit it
        stopping = lambda: stop.value != 0 or os.getppid() != first_id  # noqa: E731
        try:
            for message in timed_passes(opts, epochs, persistent, stopping):
                status.send(message)
            status.send(("done", {}))
        finally:
            stop_children(set())  # the DataLoader's workers, persistent or not

    in_worker(opts.spec.name, status, body)


def run_once(opts: Options, epochs: int, persistent: bool | None, folder: str, progress=None) -> dict:
    """One fresh process through `epochs` passes: {"loader": info, "passes": [...], "workers": [...]}."""
    ctx = loader_start.context()
    shutdown.start_resource_tracker()
    stop = ctx.RawValue("b", 0)
    log = os.path.join(folder, f"workers-{persistent}.log")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_epoch_process, args=(opts, epochs, persistent, writer, stop, os.getpid(), log), daemon=True
    )
    procs, readers = [proc], [reader]

    def stop_all() -> None:
        stop_trees(procs, readers, stop, opts.spec.name)

    shutdown.register(stop_all)  # Ctrl-C or SIGTERM: the process stops its loader (DataLoader workers too)
    try:
        proc.start()
        writer.close()
        out: dict = {"loader": None, "passes": []}
        for kind, body in messages(opts.spec.name, proc, reader):
            if kind == "loader":
                out["loader"] = body
            elif kind == "epoch":
                out["passes"].append(body)
                if progress:
                    progress(out["loader"], len(out["passes"]), body)
        out["workers"] = read_worker_log(log)
        return out
    finally:
        shutdown.unregister(stop_all)
        stop_all()


def read_worker_log(path: str) -> list[dict]:
    """The DataLoader workers' lines "pid id began ready", as dicts; none where no worker wrote."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        pid, wid, began, ready = line.split()
        out.append({"pid": int(pid), "id": int(wid), "began": float(began), "ready": float(ready)})
    return out


def _progress(info: dict, epoch: int, p: dict) -> None:
    """One line per epoch as it ends."""
    n = len(p["times"])
    rate = window_rate(sum(p["images"]), p["times"][-1] - p["start"], n, need=STEP_BATCHES)
    print(
        f"  epoch {epoch}: first batch after {p['times'][0] - p['start']:.2f} s, {n} batches, "
        + (not_measured(n) if rate is None else f"{rate:.1f} images/s"),
        flush=True,
    )


def main(args) -> int:
    """The CLI of --loader-only --epochs N (bench_input.py hands over its parsed flags)."""
    from profiler import epoch_report

    spec = LoaderSpec.parse(args.loader, args.loader_arg)
    spec.resolve()
    opts = Options(spec, batch=args.batch or 64, timeout=args.loader_timeout)
    print(f"loader {spec.name} alone (no trainer): {args.epochs} epoch(s) in one process", flush=True)
    timeline = Timeline(LOADER_STAGE) if args.out else None  # timeline.{json,png} beside loader-epochs.json
    with private_tmpdir() as folder, timeline or contextlib.nullcontext():
        runs = [run_once(opts, args.epochs, None, folder, _progress)]
        info = runs[0]["loader"]
        if info["kind"] == "dataloader" and info["num_workers"] > 0:
            other = not info["persistent_workers"]
            print(f"again with persistent_workers={other}, in a fresh process", flush=True)
            runs.append(run_once(opts, args.epochs, other, folder, _progress))
    doc = epoch_report.document(spec.name, args.epochs, runs, os.cpu_count() or 1)
    if timeline is None:
        return print_and_write(args, doc, epoch_report)
    for run in runs:  # each epoch a window; its batches the loader's images/s (time.monotonic: perf_counter's clock)
        workers = run["loader"]["persistent_workers"]
        for k, p in enumerate(run["passes"], 1):
            label = f"epoch {k}" + ("" if workers is None else f" (persistent_workers={workers})")
            timeline.add_steps(p["times"], p["images"])
            timeline.add_window(label, p["start"], p["end"])
    return print_and_write(args, doc, epoch_report, timeline_files(timeline.document()))
