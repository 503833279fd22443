"""`bench_input.py --loader M:F --loader-only`: the user's loader alone, at 1, 2, ... workers, no trainer.

Each point starts fresh worker processes, each with its own copy of the
loader and its own shard of the seed (as the `loader` producer runs it),
waits until every worker has yielded its warm-up batches, then lets them run
for a window. Each worker counts the images of the batches it finished after
the window opened, between two batch boundaries, so the rate has no
partial-batch error; the CPU its process tree used (DataLoader workers
included) over the same span says how many cores it took. Nothing is sent
anywhere: this is the loader's own ceiling.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from core.errors import FeedbenchError
from core.loader_spec import DEFAULT_TIMEOUT, LoaderError, LoaderSpec, batches
from producers import parent
from producers.launcher import stop_workers
from producers.loader import worker_seed
from profiler.cpu import tree_cpu_seconds
from profiler.timeline import Timeline
from profiler.timeline import out_files as timeline_files
from runner import shutdown

# Per worker, in shared memory: batches so far, images in the window, window start, last batch end, images so far.
_FIELDS = 5
WARMUP_BATCHES = 2
LOADER_STAGE = "loader"  # the timeline's stage: the loader's workers and their own processes


@dataclass(frozen=True)
class Options:
    """What the sweep runs: the loader and how long each point lasts."""

    spec: LoaderSpec
    batch: int = 64  # for loaders that yield samples
    seconds: float = 5.0  # the measured window per point
    warmup_batches: int = WARMUP_BATCHES
    timeout: float = DEFAULT_TIMEOUT
    seed: int = 0


def worker_counts(max_workers: int) -> list[int]:
    """1, 2, 4, ... and `max_workers` itself."""
    out, n = [], 1
    while n < max_workers:
        out.append(n)
        n *= 2
    return [*out, max_workers]


def in_worker(name: str, status: Connection, body: Callable[[], None]) -> None:
    """A worker process's frame around `body`: it dies with its parent, and says the loader's error in one line.

    It exits without finalising: a hung loader's thread must not hold the exit.
    """
    parent.die_with_parent(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        body()
    except FeedbenchError as e:
        status.send(("error", str(e)))
    except Exception as e:
        status.send(("error", f"loader {name}: {type(e).__name__}: {e}"))
    finally:
        status.close()
    os._exit(0)


def _worker(opts: Options, i: int, workers: int, shared, go, stop, status: Connection, first_id: int) -> None:
    """One copy of the loader: iterate it, counting images once the window is open.

    `first_id` is the sweep's pid: a worker that starts after the sweep died sees another parent and stops.
    """
    base = i * _FIELDS

    def body() -> None:
        it = batches(
            opts.spec, opts.batch, seed=worker_seed(opts.seed, i), worker=i, num_workers=workers,
            timeout=opts.timeout, should_stop=lambda: stop.value != 0 or os.getppid() != first_id,
        )  # fmt: skip
        try:
            started = False
            for images, _labels in it:
                now = time.perf_counter()
                shared[base] += 1
                shared[base + 4] += len(images)  # for the timeline's images/s, outside the window too
                if started:
                    shared[base + 1] += len(images)
                    shared[base + 3] = now
                elif go.value:
                    started = True
                    shared[base + 2] = shared[base + 3] = now
                if stop.value:
                    break
            else:
                if not stop.value:
                    status.send(("error", f"loader {opts.spec.name}: ran out of batches during the measurement"))
        finally:
            it.close()  # stops the loader's own processes

    in_worker(opts.spec.name, status, body)


def measure(opts: Options, workers: int, timeline: Timeline | None = None) -> dict:
    """One point: `workers` copies of the loader; images/s in total and per worker, and CPU cores used.

    `timeline`: counts the point's images (after the earlier points') and gets its window.
    """
    spawn = mp.get_context("spawn")
    shutdown.start_resource_tracker()
    shared = spawn.RawArray("d", workers * _FIELDS)
    if timeline is not None:
        _count_into(timeline, shared, workers)
    go, stop = spawn.RawValue("b", 0), spawn.RawValue("b", 0)
    procs, readers = [], []

    def stop_all() -> None:
        stop_workers(procs, readers, stop)

    shutdown.register(stop_all)  # Ctrl-C or SIGTERM: the workers stop their loaders (DataLoader workers too)
    try:
        for i in range(workers):
            reader, writer = spawn.Pipe(duplex=False)
            p = spawn.Process(
                target=_worker, args=(opts, i, workers, shared, go, stop, writer, os.getpid()), daemon=True
            )
            p.start()
            writer.close()
            procs.append(p)
            readers.append(reader)

        def check() -> None:
            _check_workers(opts, procs, readers)

        # Warm-up: every copy has started and yielded a few batches (the first is the slowest).
        _wait_until(
            lambda: min(shared[i * _FIELDS] for i in range(workers)) >= opts.warmup_batches,
            opts.timeout * (opts.warmup_batches + 1), check,
            f"loader {opts.spec.name}: no warm-up batches within {opts.timeout:g} s",
        )  # fmt: skip
        cpu0 = {p.pid: tree_cpu_seconds(p.pid) for p in procs}
        t0 = time.perf_counter()
        go.value = 1
        end = time.monotonic() + opts.seconds
        while time.monotonic() < end:
            check()
            time.sleep(0.02)
        # Every worker must have finished at least one full batch inside the window.
        _wait_until(
            lambda: min(shared[i * _FIELDS + 1] for i in range(workers)) > 0, opts.timeout, check,
            f"loader {opts.spec.name}: no batch within {opts.timeout:g} s",
        )  # fmt: skip
        stop.value = 1
        wall = time.perf_counter() - t0
        if timeline is not None:
            timeline.add_window(f"{workers} worker(s)", t0, t0 + wall)
        cpu1 = {p.pid: tree_cpu_seconds(p.pid) for p in procs}
        return _point(shared, workers, wall, cpu0, cpu1)
    finally:
        shutdown.unregister(stop_all)
        stop_workers(procs, readers, stop)


def _count_into(timeline: Timeline, shared, workers: int) -> None:
    """The timeline's loader counter: images of the earlier points, then this point's workers' so far."""
    before = timeline.counters.get(LOADER_STAGE)
    done = before() if before else 0.0
    timeline.counters[LOADER_STAGE] = lambda: done + sum(shared[i * _FIELDS + 4] for i in range(workers))


def _check_workers(opts: Options, procs: list, readers: list[Connection]) -> None:
    """Raise LoaderError for the first worker that reported an error or died."""
    for r in wait(readers, timeout=0):
        try:
            kind, text = r.recv()
        except (EOFError, OSError):
            readers.remove(r)
            continue
        raise LoaderError(text)
    for i, p in enumerate(procs):
        if not p.is_alive() and p.exitcode != 0:
            raise LoaderError(f"loader {opts.spec.name}: worker {i} died (exit code {p.exitcode})")


def _wait_until(done: Callable[[], bool], seconds: float, check: Callable[[], None], message: str) -> None:
    """Poll `done` while `check` watches the workers; LoaderError(message) after `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        check()
        if time.monotonic() > deadline:
            raise LoaderError(message)
        time.sleep(0.02)


def _point(shared, workers: int, wall: float, cpu0: dict, cpu1: dict) -> dict:
    """The point's figures from the workers' shared counts and their CPU time over the window."""
    per_worker = []
    for i in range(workers):
        images, start, last = shared[i * _FIELDS + 1], shared[i * _FIELDS + 2], shared[i * _FIELDS + 3]
        per_worker.append(images / (last - start) if last > start else 0.0)
    cpu_s = sum((cpu1[p] or 0.0) - (cpu0[p] or 0.0) for p in cpu0)
    total = sum(per_worker)
    return {
        "workers": workers,
        "images_per_sec": total,
        "images_per_sec_per_worker": total / workers,
        "worker_rates": per_worker,
        "cpu_cores": cpu_s / wall if wall > 0 else 0.0,
        "window_s": wall,
    }


@contextlib.contextmanager
def private_tmpdir() -> Iterator[str]:
    """TMPDIR for the workers: a folder of the sweep's own, removed at the end or on Ctrl-C/SIGTERM.

    A worker stopped mid-way, and its DataLoader's worker processes, leave
    multiprocessing's pymp-* folders (and whatever the loader wrote there) behind.
    """
    folder = tempfile.mkdtemp(prefix="fb-")  # short: sockets go in it, and their paths are limited
    before = os.environ.get("TMPDIR")

    def remove() -> None:
        shutil.rmtree(folder, ignore_errors=True)

    os.environ["TMPDIR"] = folder  # spawned workers read it when they start
    shutdown.register(remove)
    try:
        yield folder
    finally:
        shutdown.unregister(remove)
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        remove()


def sweep(opts: Options, counts: list[int], progress=None, timeline: Timeline | None = None) -> list[dict]:
    """Every point in turn, with scaling efficiency against one worker."""
    rows: list[dict] = []
    for n in counts:
        row = measure(opts, n, timeline)
        one = rows[0]["images_per_sec"] if rows else row["images_per_sec"] / n
        row["scaling_efficiency"] = row["images_per_sec"] / (n * one) if one > 0 else 0.0
        rows.append(row)
        if progress:
            progress(row)
    return rows


def main(args) -> int:
    """The CLI of --loader-only (bench_input.py hands over its parsed flags)."""
    from core.emulate import EmulateError, Emulation
    from core.errors import ConfigError
    from profiler import loader_report

    spec = LoaderSpec.parse(args.loader, args.loader_arg)
    spec.resolve()
    demand = None
    if args.emulate or args.emulate_rate is not None or args.num_devices:
        try:
            emu = Emulation.of(args.emulate, args.emulate_rate)
        except EmulateError as e:
            raise ConfigError(str(e)) from None
        demand = loader_report.Demand(emu.device, emu.images_per_sec, args.num_devices or 1, emu.source)
    max_workers = args.loader_workers or os.cpu_count() or 1
    opts = Options(spec, batch=args.batch or 64, seconds=args.loader_seconds, timeout=args.loader_timeout)
    counts = worker_counts(max_workers)
    print(
        f"loader {spec.name} alone (no trainer): {', '.join(map(str, counts))} worker(s), "
        f"{opts.seconds:g} s each after {opts.warmup_batches} warm-up batches",
        flush=True,
    )
    timeline = Timeline(LOADER_STAGE) if args.out else None  # timeline.{json,png} beside loader.*
    with timeline or contextlib.nullcontext():
        rows, stages = _measure_all(args, spec, opts, counts, timeline)
    doc = loader_report.document(spec.name, rows, demand, stages, os.cpu_count() or 1)
    return print_and_write(args, doc, loader_report, timeline_files(timeline.document()) if timeline else None)


def print_and_write(args, doc: dict, report, extra: dict[str, str | bytes] | None = None) -> int:
    """The report printed, then the files --json and --out ask for; `report` is the module that words and writes it.

    `extra`: more files for --out (the run's timeline), written with the report's own.
    """
    print()
    print(report.text(doc))
    files = []
    if args.json_path:
        report.write_json(args.json_path, doc)
        files.append(args.json_path)
    if args.out:
        files += report.write_files(args.out, doc, extra)
    if files:
        print("\n" + "\n".join(f"wrote {f}" for f in files))
    sys.stdout.flush()
    return 0


def _measure_all(args, spec: LoaderSpec, opts: Options, counts: list[int], timeline: Timeline | None):
    """(the sweep's rows, the per-stage timing or None): everything --loader-only measures."""
    with private_tmpdir():
        rows = sweep(
            opts, counts,
            lambda r: print(f"  {r['workers']} worker(s): {r['images_per_sec']:.1f} images/s", flush=True),
            timeline,
        )  # fmt: skip
    stages = None
    if not args.no_stages:
        from core.loader_stages import profile

        try:
            stages = profile(spec, seed=0, timeout=opts.timeout)
        except LoaderError as e:  # the sweep's figures stand; the table says why there are no stages
            stages = {"loader": spec.name, "stages": [], "note": f"per-stage timing stopped: {e}"}
    return rows, stages
