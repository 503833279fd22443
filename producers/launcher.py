"""Run a producer as N worker processes and stop every one of them, whatever happens.

Workers die with their parent (PR_SET_PDEATHSIG), the parent stops them on
SIGINT/SIGTERM, and a start-up failure in any worker (a bad endpoint, say)
stops the rest and is reported as one line.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
from dataclasses import replace

from tqdm import tqdm

from producers import sender
from producers.sender import Counters, SendConfig, Source
from wire.curve import CurveError
from wire.endpoints import EndpointError
from wire.shm import regions_of

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the parent's cleanup still stops us
        pass


def _worker(source: Source, worker: int, cfg: SendConfig, shared, stop, status) -> None:
    """Entry point of one worker process."""
    _die_with_parent()
    parent = os.getppid()
    # Ctrl-C reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def should_stop() -> bool:
        return stop.is_set() or os.getppid() != parent

    try:
        code = sender.run(
            source,
            worker,
            cfg,
            Counters(shared, worker),
            should_stop,
            on_ready=lambda: status.put((worker, "ready", "")),
        )
    except (EndpointError, CurveError) as e:
        status.put((worker, "error", str(e)))
        code = sender.BAD_ENDPOINT
    except Exception as e:  # reported by the parent as one line, not a worker traceback
        status.put((worker, "error", f"{type(e).__name__}: {e}"))
        code = sender.FAILED
    if code == sender.CONSUMER_GONE:
        status.put((worker, "gone", f"no consumer took a batch for {cfg.give_up_after:g} s"))
    sys.exit(code)


def _split(count: int | None, workers: int) -> list[int | None]:
    if count is None:
        return [None] * workers
    return [count // workers + (1 if i < count % workers else 0) for i in range(workers)]


def launch(
    source: Source,
    cfg: SendConfig,
    workers: int = 1,
    progress: bool = True,
    describe: str = "",
) -> int:
    """Run `workers` senders until they finish or a signal arrives; returns the exit code.

    `cfg.count` is the total number of batches across workers. Worker i sends
    as producer id `cfg.producer_id + i`, so the consumer can account for each.
    """
    if cfg.bind and workers > 1:
        # N workers cannot bind one endpoint; let the consumer bind and the workers connect.
        raise ValueError("--bind takes one worker; with several, let the consumer bind and the workers connect")
    spawn = mp.get_context("spawn")
    shared = spawn.RawArray("d", workers * len(Counters.FIELDS))
    stop = spawn.Event()
    status = spawn.Queue()
    procs = []
    interrupted = []

    def on_signal(signum, _frame) -> None:
        interrupted.append(signum)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i, n in enumerate(_split(cfg.count, workers)):
            wcfg = replace(cfg, count=n, producer_id=cfg.producer_id + i)
            p = spawn.Process(target=_worker, args=(source, i, wcfg, shared, stop, status), daemon=True)
            p.start()
            procs.append(p)
        return _supervise(procs, status, stop, shared, cfg, workers, progress, describe, interrupted)
    finally:
        stop.set()
        for p in procs:
            p.join(5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
            for region in regions_of(p.pid):  # a worker killed before its consumer mapped its region
                region.unlink(missing_ok=True)
        for s, h in old.items():
            signal.signal(s, h)


def _supervise(procs, status, stop, shared, cfg, workers, progress, describe, interrupted) -> int:
    """Print progress until the workers end; turn worker reports into one exit code."""
    code = sender.DONE
    bar = None
    if progress:
        bar = tqdm(total=cfg.count, unit="batch", desc=describe or "producer", file=sys.stderr, dynamic_ncols=True)
    last_t, last = time.perf_counter(), Counters.totals(shared)
    reported: set[int] = set()

    def drain() -> None:
        while True:
            try:
                worker, kind, text = status.get(timeout=0.05)
            except queue.Empty:
                return
            if kind in ("error", "gone") and worker not in reported:
                reported.add(worker)
                print(f"error: producer worker {worker}: {text}", file=sys.stderr)
                if kind == "error":
                    stop.set()  # one broken worker stops the producer

    try:
        while any(p.is_alive() for p in procs) and not interrupted:
            time.sleep(0.2)
            drain()
            now, tot = time.perf_counter(), Counters.totals(shared)
            if bar is not None and now - last_t >= 1.0:
                dt = now - last_t
                db = tot["batches"] - last["batches"]
                bar.update(int(tot["batches"]) - bar.n)
                bar.set_postfix_str(
                    f"{db / dt:.1f} batch/s, {(tot['images'] - last['images']) / dt:.0f} img/s, "
                    f"{(tot['bytes'] - last['bytes']) / dt / 1e6:.0f} MB/s, "
                    f"send latency {1e3 * (tot['send_wait_s'] - last['send_wait_s']) / max(db, 1):.1f} ms"
                )
                last_t, last = now, tot
    finally:
        if bar is not None:
            bar.update(int(Counters.totals(shared)["batches"]) - bar.n)
            bar.close()
    for p in procs:
        p.join(10)
        if p.exitcode not in (None, 0):
            code = max(code, p.exitcode if p.exitcode > 0 else sender.FAILED)
    drain()
    return 0 if interrupted else code
