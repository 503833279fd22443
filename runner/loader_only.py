"""`bench_input.py --loader M:F --loader-only`: the user's loader alone, at 1, 2, ... workers, no trainer.

Each point starts new worker processes (copies of this one where that is
safe, core/loader_start.py), each making its own copy of the
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
import gc
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext

import psutil

from core import loader_processes, loader_start
from core.errors import ConfigError, FeedbenchError
from core.loader_duplicates import count_epochs, duplicates
from core.loader_spec import DEFAULT_TIMEOUT, LoaderError, LoaderSpec, allow_children, batches, worker_seed
from producers import parent
from producers.launcher import stop_workers
from profiler.cpu import tree_cpu_seconds, tree_rss_bytes
from profiler.loader_report import Demand
from profiler.timeline import Timeline
from profiler.timeline import out_files as timeline_files
from profiler.uncertainty import BOUNDARY_BATCHES, median_interval, not_measured, window_rate
from runner import shutdown
from runner.folder_reaper import FolderReaper, private_tmpdir_folder

# Per worker, in shared memory: batches so far, images in the window, window start, last batch end, images so far.
_FIELDS = 5
WARMUP_BATCHES = 2
SLICES = 8  # a window's slices, for the interval of its rate (min-max of 8: 99% for the median)
SLICE_BATCHES = BOUNDARY_BATCHES  # the fewest batches of each worker in a slice: prefetched batches arrive in bursts
SPAN_SHARE = 0.5  # a slice's batches span at least this share of its time: a burst alone is no slice
MIN_SLICES = 3  # the fewest slices for a point's rate (their min–max: 75% for the median); fewer: not measured
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

    The loader may start processes of its own (core/loader_processes.py): this process adopts them, stops
    every one still running when `body` is done, and sends ("left", [...]) naming those the loader's callable
    started. It exits without finalising: a hung loader's thread must not hold the exit.
    """
    parent.die_with_parent(signal.SIGTERM)
    os.setpgid(0, 0)  # a group of its own: what it starts is stopped with it even once it was killed (stop_trees)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: _exit_on_sigterm(run))
    loader_start.in_child()
    loader_processes.adopt_orphans()
    allow_children()  # multiprocessing refuses children to a daemonic process
    try:
        body()
    except FeedbenchError as e:
        status.send(("error", str(e)))
    except Exception as e:
        status.send(("error", f"loader {name}: {type(e).__name__}: {e}"))
    finally:
        left = loader_processes.stop_all()
        with contextlib.suppress(OSError):
            if left:
                status.send(("left", left))
        status.close()
    release_queues()
    os._exit(0)


RUN_TMPDIR_ENV = "FEEDBENCH_LOADER_TMPDIR"  # the run's private TMPDIR (private_tmpdir), for its orphaned processes


def _exit_on_sigterm(run: int) -> None:
    """SIGTERM: exit at once. Where the run's process is gone (killed: PR_SET_PDEATHSIG sent this), first stop
    what this process started and remove the run's private TMPDIR, which the dead run cannot remove.

    The kernel sends PR_SET_PDEATHSIG's signal while the parent exits, before this process is handed to
    another parent: getppid() changes a moment later.
    """
    deadline = time.monotonic() + 1.0
    while os.getppid() == run and time.monotonic() < deadline:
        time.sleep(0.01)
    if os.getppid() != run:
        loader_processes.stop_all(grace=1.0)
        folder = os.environ.get(RUN_TMPDIR_ENV)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


def release_queues(timeout: float = 2.0) -> None:
    """Let the loader's multiprocessing queues go before an exit that runs no finaliser.

    A queue's feeder thread holds two of its semaphores until it has flushed the queue's close; a process
    that exits while it still runs leaves them registered, and the resource tracker reports them "leaked" at
    the run's end. Each feeder gets a bounded wait (a hung one must not hold the exit), then the queues are
    collected, which unregisters their semaphores.
    """
    deadline = time.monotonic() + timeout
    for t in threading.enumerate():
        if t.name == "QueueFeederThread":
            t.join(max(0.0, deadline - time.monotonic()))
    gc.collect()


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


def measure(opts: Options, workers: int, timeline: Timeline | None = None, label: str | None = None) -> dict:
    """One point: `workers` copies of the loader; images/s in total and per worker, CPU cores and memory used,
    and the interval of the rate from the window's slices.

    `timeline`: counts the point's images (after the earlier points') and gets its window, named `label`.
    """
    ctx = loader_start.context()
    shutdown.start_resource_tracker()
    shared = ctx.RawArray("d", workers * _FIELDS)
    if timeline is not None:
        _count_into(timeline, shared, workers)
    go, stop = ctx.RawValue("b", 0), ctx.RawValue("b", 0)
    procs, readers = [], []

    def stop_all() -> None:
        stop_trees(procs, readers, stop, opts.spec.name)

    shutdown.register(stop_all)  # Ctrl-C or SIGTERM: the workers stop their loaders (DataLoader workers too)
    try:
        _start_workers(ctx, opts, workers, (shared, go, stop), procs, readers)

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
        slices = _Slices(shared, workers, opts.seconds / SLICES)
        end = time.monotonic() + opts.seconds
        # Too few slices for a rate by the window's end: measured longer, up to as long again, then "not measured".
        while time.monotonic() < end or (len(slices.rates) < MIN_SLICES and time.monotonic() < end + opts.seconds):
            check()
            slices.tick([p.pid for p in procs])
            time.sleep(0.02)
        # Every worker must have finished at least one full batch inside the window.
        _wait_until(
            lambda: min(shared[i * _FIELDS + 1] for i in range(workers)) > 0, opts.timeout, check,
            f"loader {opts.spec.name}: no batch within {opts.timeout:g} s",
        )  # fmt: skip
        stop.value = 1
        wall = time.perf_counter() - t0
        if timeline is not None:
            timeline.add_window(label or f"{workers} worker(s)", t0, t0 + wall)
        cpu1 = {p.pid: tree_cpu_seconds(p.pid) for p in procs}
        return _point(workers, wall, cpu0, cpu1, slices.figures())
    finally:
        shutdown.unregister(stop_all)
        stop_all()


def epoch_counts(opts: Options, workers: list[int] | None) -> tuple[int, dict[int, int | None] | None]:
    """(the last worker count asked about, core.loader_duplicates.count_epochs of the loader made once with 0
    and each of `workers` DataLoader workers, None: its own num_workers). Run in a fresh process."""
    allow_children()  # a DataLoader's workers are this process's children
    obj = opts.spec.build(opts.seed, 0, 1, {}, timeout=opts.timeout)
    given = [getattr(obj, "num_workers", 0)] if workers is None else workers
    return given[-1] if given else 0, count_epochs(obj, given, opts.spec.name)


def samples_per_epoch(opts: Options, workers: list[int] | None = None) -> tuple[int, dict[int, int | None] | None]:
    """`epoch_counts` in a fresh process: the counts are None for a loader that cannot repeat samples per worker
    (core/loader_duplicates.py)."""
    return in_fresh_process(opts.spec.name, "the epoch-counting process", epoch_counts, opts, workers)


_STOPPING = threading.Lock()  # the run's own ending and a Ctrl-C's clean-up may call stop_trees at once


def stop_trees(procs: list, readers: list[Connection], stop, name: str) -> None:
    """stop_workers, then whatever the workers' loaders started that outlived them; says what the loader `name`
    left running (each worker's "left" message, core/loader_processes.py).

    A worker that was killed (by the user, or here: it did not stop its loader within the grace) leaves its
    loader's own processes behind, orphaned: a DataLoader's workers, which notice only seconds later and fail
    once the run's TMPDIR is gone, or a DataFlow's MultiProcessRunnerZMQ without python-prctl, which never
    does. Each worker leads a process group of its own (`in_worker`) that they are in: they are killed with
    it, first thing, so that nothing of theirs is printed after the one line that says what happened; and
    those psutil saw below a worker that was still running are killed too. One call at a time: two threads
    closing one reader close its descriptor twice (EBADF, or worse, a descriptor opened in between).
    """
    with _STOPPING:
        _stop_trees(procs, readers, stop, name)


def _stop_trees(procs: list, readers: list[Connection], stop, name: str) -> None:
    for p in procs:
        if p.pid is not None and not p.is_alive():  # it was killed: its group is all that is left of it
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
    kids = []
    for p in procs:
        with contextlib.suppress(psutil.Error, ValueError):
            kids += psutil.Process(p.pid).children(recursive=True)
    stop_workers(procs, [], stop)
    for p in procs:
        if p.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
    for r in readers:
        with contextlib.suppress(EOFError, OSError):
            while r.poll(0):
                kind, body = r.recv()
                if kind == "left":
                    loader_processes.say_left(name, body)
        r.close()
    for k in kids:
        with contextlib.suppress(psutil.Error):
            k.kill()


def _start_workers(
    ctx: BaseContext, opts: Options, workers: int, flags: tuple, procs: list, readers: list[Connection]
) -> None:
    """`workers` new processes (core/loader_start.py), each making its own copy of the loader;
    `flags`: (shared counts, go, stop)."""
    shared, go, stop = flags
    for i in range(workers):
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(opts, i, workers, shared, go, stop, writer, os.getpid()), daemon=True)
        p.start()
        writer.close()
        procs.append(p)
        readers.append(reader)


class _Slices:
    """The window cut into slices at batch boundaries: the point's rate is their median, its interval theirs;
    and the peak resident memory.

    A slice ends at a tick once every worker has finished SLICE_BATCHES batches since the last slice ended,
    `length` seconds have passed (so a slow loader's window has fewer slices), and each worker's batches span
    at least SPAN_SHARE of the slice (a burst of prefetched batches does not: the slice waits for the next
    batch). Its rate is each worker's images between its own batch boundaries over their time
    (profiler/uncertainty.py `window_rate`), summed, so no slice has a partial batch's error.
    """

    def __init__(self, shared, workers: int, length: float) -> None:
        self.shared, self.workers, self.length = shared, workers, length
        self.anchor = [self._at(i) for i in range(workers)]
        self.first: list[tuple[float, float, float] | None] = [None] * workers
        self.rates: list[float] = []
        self.totals = [[0.0, 0.0, 0.0] for _ in range(workers)]  # per worker: images, seconds, batches in slices
        self.peak_rss, self.next_rss, self.opened = 0.0, 0.0, time.monotonic()

    def _at(self, i: int) -> tuple[float, float, float]:
        """(images counted in the window, when its last batch ended, batches so far) for worker `i`."""
        return self.shared[i * _FIELDS + 1], self.shared[i * _FIELDS + 3], self.shared[i * _FIELDS]

    def tick(self, pids: list[int]) -> None:
        now = time.monotonic()
        if now >= self.next_rss:  # resident memory twice a second: a /proc walk of each worker's tree
            self.peak_rss = max(self.peak_rss, sum(tree_rss_bytes(p) or 0 for p in pids))
            self.next_rss = now + 0.5
        at = [self._at(i) for i in range(self.workers)]
        if any(a[1] == 0 for a in self.anchor):  # a worker's window opens at its first batch boundary
            self.anchor = [x if a[1] == 0 else a for x, a in zip(at, self.anchor, strict=True)]
            self.first = [a if a[1] else None for a in self.anchor]
            self.opened = now
            return
        wall = now - self.opened
        if wall < self.length or any(
            x[2] - a[2] < SLICE_BATCHES or x[1] - a[1] < SPAN_SHARE * wall for x, a in zip(at, self.anchor, strict=True)
        ):
            return
        rates = []
        for k, (x, a) in enumerate(zip(at, self.anchor, strict=True)):
            got = (x[0] - a[0], x[1] - a[1], x[2] - a[2])
            rates.append(window_rate(*got, need=SLICE_BATCHES))
            self.totals[k] = [t + g for t, g in zip(self.totals[k], got, strict=True)]
        self.rates.append(sum(r for r in rates if r is not None))
        self.anchor, self.opened = at, now

    def batches(self) -> int:
        """Batches every worker finished since its window opened."""
        return int(sum(self._at(i)[2] - f[2] for i, f in enumerate(self.first) if f is not None))

    def figures(self) -> dict:
        """The point's rate (the slices' median) and its interval (profiler/uncertainty.py), or "not measured"
        with fewer than MIN_SLICES slices; each worker's rate over its slices; the peak memory."""
        measured = len(self.rates) >= MIN_SLICES
        lo, hi, conf = median_interval(self.rates) if measured else (None, None, 0.0)
        return {
            "images_per_sec": statistics.median(self.rates) if measured else None,
            "not_measured": None if measured else not_measured(self.batches()),
            "batches": self.batches(),
            "slice_rates": self.rates,
            "interval": [lo, hi] if measured else None,
            "interval_confidence": conf,
            "worker_rates": [window_rate(*t, need=SLICE_BATCHES) for t in self.totals],
            "rss_mb": self.peak_rss / 1e6,
        }


def _count_into(timeline: Timeline, shared, workers: int) -> None:
    """The timeline's loader counter: (images, batches) of the earlier points, then this point's workers' so far."""
    before = timeline.counters.get(LOADER_STAGE)
    images, batches = before() if before else (0.0, 0.0)
    timeline.counters[LOADER_STAGE] = lambda: (
        images + sum(shared[i * _FIELDS + 4] for i in range(workers)),
        batches + sum(shared[i * _FIELDS] for i in range(workers)),
    )


def _check_workers(opts: Options, procs: list, readers: list[Connection]) -> None:
    """Raise LoaderError for the first worker that reported an error or died."""
    for r in wait(readers, timeout=0):
        try:
            kind, text = r.recv()
        except (EOFError, OSError):
            readers.remove(r)
            continue
        if kind == "left":
            loader_processes.say_left(opts.spec.name, text)
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


def _point(workers: int, wall: float, cpu0: dict, cpu1: dict, slices: dict) -> dict:
    """The point's figures: its slices' (rate, interval, per worker) and its workers' CPU time over the window."""
    cpu_s = sum((cpu1[p] or 0.0) - (cpu0[p] or 0.0) for p in cpu0)
    rate = slices["images_per_sec"]
    return {
        "workers": workers,
        **slices,
        "images_per_sec_per_worker": rate / workers if rate is not None else None,
        "cpu_cores": cpu_s / wall if wall > 0 else 0.0,
        "window_s": wall,
    }


@contextlib.contextmanager
def private_tmpdir() -> Iterator[str]:
    """TMPDIR for the workers: a folder of the sweep's own, removed at the end or on Ctrl-C/SIGTERM, by the
    workers themselves where this process was killed (SIGKILL: `_exit_on_sigterm`), and by a watcher outside
    the run's group where everything was killed at once (runner/folder_reaper.py).

    A worker stopped mid-way, and its DataLoader's worker processes, leave
    multiprocessing's pymp-* folders (and whatever the loader wrote there) behind.
    """
    folder = private_tmpdir_folder()  # short: sockets go in it, and their paths are limited
    reaper = FolderReaper(folder)  # and where the run and its processes were all killed at once
    before = {k: os.environ.get(k) for k in ("TMPDIR", RUN_TMPDIR_ENV)}

    def remove() -> None:
        shutil.rmtree(folder, ignore_errors=True)

    os.environ["TMPDIR"] = folder  # the workers read it when they start (core/loader_start.py)
    os.environ[RUN_TMPDIR_ENV] = folder  # and remove it where this process was killed (_exit_on_sigterm)
    shutdown.register(remove)
    try:
        yield folder
    finally:
        shutdown.unregister(remove)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        remove()
        reaper.close()


def sweep(opts: Options, counts: list[int], progress=None, timeline: Timeline | None = None) -> list[dict]:
    """Every point in turn, with scaling efficiency against one worker."""
    rows: list[dict] = []
    for n in counts:
        row = measure(opts, n, timeline)
        one = rows[0]["images_per_sec"] if rows else row["images_per_sec_per_worker"]
        rate = row["images_per_sec"]
        row["scaling_efficiency"] = rate / (n * one) if rate is not None and one else None
        rows.append(row)
        if progress:
            progress(row)
    return rows


def main(args) -> int:
    """The CLI of --loader-only (bench_input.py hands over its parsed flags)."""
    from profiler import loader_report

    spec = LoaderSpec.parse(args.loader, args.loader_arg)
    spec.resolve()
    demand = demand_of(args)
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
    doc["duplicates"] = given_duplicates(opts)
    return print_and_write(args, doc, loader_report, timeline_files(timeline.document()) if timeline else None)


def given_duplicates(opts: Options) -> dict | None:
    """Whether the loader as given yields each sample more than once per epoch (a DataLoader whose workers each
    iterate all of an IterableDataset): `core.loader_duplicates.duplicates`, or why it could not be checked."""
    with private_tmpdir():
        try:
            workers, counts = samples_per_epoch(opts)
        except LoaderError as e:
            return {"checked": False, "num_workers": None, "why": str(e)}
    return duplicates(counts, workers)


def demand_of(args) -> Demand | None:
    """What the loader should feed: --target-rate, or --emulate/--emulate-rate with --num-devices; None without."""
    from core.emulate import EmulateError, Emulation

    if args.target_rate is not None:
        return Demand("target", args.target_rate, 1, f"--target-rate {args.target_rate:g}")
    if not (args.emulate or args.emulate_rate is not None or args.num_devices):
        return None
    try:
        emu = Emulation.of(args.emulate, args.emulate_rate)
    except EmulateError as e:
        raise ConfigError(str(e)) from None
    return Demand(emu.device, emu.images_per_sec, args.num_devices or 1, emu.source)


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
            lambda r: print(f"  {r['workers']} worker(s): {rate_words(r)}", flush=True),
            timeline,
        )  # fmt: skip
        return rows, None if args.no_stages else stage_timing(spec, opts.timeout)


def rate_words(point: dict) -> str:
    """`61.2 images/s`, or why the point has no rate."""
    return point["not_measured"] or f"{point['images_per_sec']:.1f} images/s"


def stage_timing(spec: LoaderSpec, timeout: float) -> dict:
    """Where a sample's time goes (core/loader_stages.py), in a fresh process (what the loader starts is stopped
    with it); a sample that fails stops only this, said in its note."""
    try:
        return in_fresh_process(spec.name, "the per-stage timing's process", _stages, spec, timeout)
    except LoaderError as e:  # the measured figures stand; the table says why there are no stages
        return {"loader": spec.name, "stages": [], "note": f"per-stage timing stopped: {e}"}


def _stages(spec: LoaderSpec, timeout: float) -> dict:
    from core.loader_stages import profile

    return profile(spec, seed=0, timeout=timeout)


def _one_shot(name: str, status: Connection, fn: Callable, args: tuple) -> None:
    """A fresh loader process that sends ("result", fn(*args)), then ("done", {})."""

    def body() -> None:
        status.send(("result", fn(*args)))
        status.send(("done", {}))

    in_worker(name, status, body)


def in_fresh_process(name: str, what: str, fn: Callable, *args):
    """`fn(*args)` in a fresh process of the loader's (`in_worker`), never in the run's own: the processes a
    loader starts there are found and stopped with it. Its error, or its death, is a LoaderError naming `what`."""
    ctx = loader_start.context()
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_one_shot, args=(name, writer, fn, args), daemon=True)
    stop = ctx.RawValue("b", 0)

    def stop_all() -> None:
        stop_trees([proc], [reader], stop, name)

    shutdown.register(stop_all)
    try:
        proc.start()
        writer.close()
        for kind, body in messages(name, proc, reader, what):
            if kind == "result":
                return body
        raise LoaderError(f"loader {name}: {what} ended without a result")
    finally:
        shutdown.unregister(stop_all)
        stop_all()


def messages(name: str, proc, reader: Connection, what: str = "the epoch process") -> Iterator[tuple[str, dict]]:
    """A loader process's messages until it is done; its error, or its death, as a LoaderError."""
    while True:
        if not reader.poll(0.1):
            if not proc.is_alive():
                raise LoaderError(f"loader {name}: {what} died (exit code {proc.exitcode})")
            continue
        try:
            kind, body = reader.recv()
        except (EOFError, OSError):
            proc.join(5)
            raise LoaderError(f"loader {name}: {what} died (exit code {proc.exitcode})") from None
        if kind == "error":
            raise LoaderError(body)
        if kind == "done":
            return
        if kind == "left":
            loader_processes.say_left(name, body)
            continue
        yield kind, body
