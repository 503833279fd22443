"""Run a producer as N worker processes and stop every one of them, whatever happens.

Workers die with their parent (PR_SET_PDEATHSIG), the parent stops them on
SIGINT/SIGTERM, and a start-up failure in any worker (a bad endpoint, say)
stops the rest and is reported as one line. A producer started by a run
likewise dies with the run (`producers.parent`).

Nothing here uses a named semaphore (no multiprocessing Queue, Event or Lock):
those live in /dev/shm until multiprocessing's resource tracker removes them,
and a SIGKILL to the producer's process group kills the tracker too. Workers
report over pipes and watch a lock-free shared flag instead.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection, wait

from tqdm import tqdm

from core import loader_processes, loader_start
from core.atomic import atomic_write
from core.errors import FeedbenchError
from producers import parent, sender
from producers.sender import Counters, SendConfig, Source
from wire.curve import CurveError
from wire.endpoints import EndpointError


def _worker(source: Source, worker: int, cfg: SendConfig, shared, stop, status: Connection, producer: int) -> None:
    """Entry point of one worker process; `producer` is the launcher's pid.

    The launcher may die while a worker is still starting (a slow machine takes seconds to import and
    unpickle), before the worker asks for its death signal: comparing the parent with `producer`, not with
    whatever os.getppid() says at start, makes such an orphan stop at once instead of running for ever.
    """
    parent.die_with_parent(signal.SIGTERM)
    stopped = []
    # Ctrl-C reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    loader_start.in_child()  # a copied worker: TMPDIR found again, SIGTERM unblocked
    loader_processes.adopt_orphans()  # what a user's loader starts stays findable, and is stopped below

    def should_stop() -> bool:
        return bool(stopped) or stop.value != 0 or os.getppid() != producer

    def report(kind: str, text: str) -> None:
        try:
            status.send((worker, kind, text))
        except OSError:  # the producer is gone; nobody to tell
            pass

    try:
        code = sender.run(
            source,
            worker,
            cfg,
            Counters(shared, worker),
            should_stop,
            on_ready=lambda: report("ready", ""),
        )
    except (EndpointError, CurveError) as e:
        report("error", str(e))
        code = sender.BAD_ENDPOINT
    except FeedbenchError as e:  # already one line that names its cause (e.g. the user's loader)
        report("error", str(e))
        code = sender.FAILED
    except Exception as e:  # reported by the parent as one line, not a worker traceback
        report("error", f"{type(e).__name__}: {e}")
        code = sender.FAILED
    if code == sender.CONSUMER_GONE:
        report("gone", f"no consumer took a batch for {cfg.give_up_after:g} s")
    if code == sender.SLOTS_HELD:
        report(
            "gone",
            f"the consumer gave none of this worker's shm slots back for {cfg.give_up_after:g} s (it holds every "
            "batch it took, or stopped reading; --shm-slots sets how many a worker has)",
        )
        code = sender.CONSUMER_GONE
    left = loader_processes.stop_all()
    if left:
        print(f"note: worker {worker}: the loader's callable left processes running: {'; '.join(left)}; stopped "
              "them (a training loop that makes this loader leaves them running)", file=sys.stderr, flush=True)  # fmt: skip
    status.close()
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
    stats_file: str | None = None,
) -> int:
    """Run `workers` senders until they finish or a signal arrives; returns the exit code.

    `cfg.count` is the total number of batches across workers. Worker i sends
    as producer id `cfg.producer_id + i`, so the consumer can account for each.
    `stats_file` gets the producer's figures once a second (see `rates`), for
    consumers that see no native headers (the zmq op).
    """
    if cfg.bind and workers > 1:
        # N workers cannot bind one endpoint; let the consumer bind and the workers connect.
        raise ValueError("--bind takes one worker; with several, let the consumer bind and the workers connect")
    # A source builds its batches in each worker. One that may hold threads or a device (DALI, a decoder)
    # starts its workers fresh ("spawn"); one whose `start_method` says "fork" is copied from this process,
    # which has started no thread yet: no second import, no resource tracker (a user's loader: where
    # core/loader_start.py finds that safe).
    ctx = mp.get_context(getattr(source, "start_method", "spawn"))
    shared = ctx.RawArray("d", workers * len(Counters.FIELDS))
    stop = ctx.RawValue("b", 0)  # lock-free: no semaphore to leave behind
    procs = []
    readers: list[Connection] = []
    interrupted = []

    def on_signal(signum, _frame) -> None:
        interrupted.append(signum)
        stop.value = 1

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i, n in enumerate(_split(cfg.count, workers)):
            wcfg = replace(cfg, count=n, producer_id=cfg.producer_id + i)
            reader, writer = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(source, i, wcfg, shared, stop, writer, os.getpid()), daemon=True)
            p.start()
            writer.close()  # the worker holds the only writer: its end of file means it is gone
            procs.append(p)
            readers.append(reader)
        return _supervise(procs, readers, stop, shared, cfg, progress, describe, interrupted, stats_file)
    finally:
        stop_workers(procs, readers, stop)
        for s, h in old.items():
            signal.signal(s, h)
        # Only when the run that started us died:
        parent.clean_run_dir(own=[stats_file] if stats_file else [])


def stop_workers(procs: list, readers: list[Connection], stop) -> None:
    """Ask every worker to stop (`stop.value = 1`), give each 5 s, kill what is left, close the status pipes.

    A killed worker leaves no region behind: regions are anonymous (wire/shm.py) and go with their last holder.
    """
    stop.value = 1
    for p in procs:
        p.join(5)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    for r in readers:
        r.close()


def rates(now: dict[str, float], before: dict[str, float], dt: float) -> dict[str, float]:
    """The producer's figures between two counter totals `dt` seconds apart (what --stats-file holds)."""
    db = now["batches"] - before["batches"]
    return {
        "batches_per_sec": db / dt,
        "images_per_sec": (now["images"] - before["images"]) / dt,
        "bytes_per_sec": (now["bytes"] - before["bytes"]) / dt,
        "send_latency_ms": 1e3 * (now["send_wait_s"] - before["send_wait_s"]) / max(db, 1),
        "batches": now["batches"],
        "time": time.time(),
    }


def _supervise(procs, readers, stop, shared, cfg, progress, describe, interrupted, stats_file) -> int:
    """Print progress (and write the stats file) until the workers end; turn worker reports into one exit code."""
    code = sender.DONE
    bar = _progress_bar(cfg, describe) if progress else None
    last_t, last = time.perf_counter(), Counters.totals(shared)
    reports = _WorkerReports(procs, readers, stop)
    try:
        while any(p.is_alive() for p in procs) and not interrupted:
            if parent.gone():  # the run died (its SIGTERM may be on its way too)
                interrupted.append(signal.SIGTERM)
                break
            time.sleep(0.2)
            reports.drain()
            if not stop.value:
                reports.check_workers()
            now, tot = time.perf_counter(), Counters.totals(shared)
            if now - last_t >= 1.0:
                _show_rates(rates(tot, last, now - last_t), tot, stats_file, bar)
                last_t, last = now, tot
    finally:
        if bar is not None:
            bar.update(int(Counters.totals(shared)["batches"]) - bar.n)
            bar.close()
    for p in procs:
        p.join(10)
        if p.exitcode not in (None, 0):
            code = max(code, p.exitcode if p.exitcode > 0 else sender.FAILED)
    reports.drain()
    return 0 if interrupted else code


def _progress_bar(cfg: SendConfig, describe: str | None) -> tqdm:
    """The producer's progress bar on stderr: batches sent, and the last second's rates as its postfix."""
    # "Sent" is all a producer can know: a batch is handed to ZMQ for a connected consumer, which may
    # still drop it (a receive cap, a consumer that closes with batches queued).
    desc = f"{describe or 'producer'} sent"
    # One rate on the bar: what was sent over the last second (the postfix), not tqdm's own average, which
    # stays at its last figure while sending is blocked.
    fmt = (
        "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
        if cfg.count
        else "{desc}: {n_fmt} batches [{elapsed}{postfix}]"
    )
    return tqdm(total=cfg.count, unit="batch", desc=desc, file=sys.stderr, dynamic_ncols=True, bar_format=fmt)


def _show_rates(r: dict[str, float], tot: dict[str, float], stats_file: str | None, bar: tqdm | None) -> None:
    """The last second's figures: into the stats file, and onto the progress bar."""
    if stats_file:
        atomic_write(stats_file, json.dumps(r))
    if bar is not None:
        bar.update(int(tot["batches"]) - bar.n)
        bar.set_postfix_str(
            f"sent {r['batches_per_sec']:.1f} batch/s, {r['images_per_sec']:.0f} img/s, "
            f"{r['bytes_per_sec'] / 1e6:.0f} MB/s, send latency {r['send_latency_ms']:.1f} ms"
        )


class _WorkerReports:
    """What the workers say on their status pipes, and a death without a word: one line per worker, at most."""

    def __init__(self, procs: list, readers: list[Connection], stop) -> None:
        self.procs = procs
        self.open_readers = list(readers)
        self.stop = stop
        self.reported: set[int] = set()

    def drain(self) -> None:
        """Print what the workers have said; a worker's error stops the producer."""
        while ready := wait(self.open_readers, timeout=0.05):
            for r in ready:
                try:
                    worker, kind, text = r.recv()
                except (EOFError, OSError):  # the worker has exited
                    self.open_readers.remove(r)
                    continue
                if kind in ("error", "gone") and worker not in self.reported:
                    self.reported.add(worker)
                    print(f"error: producer worker {worker}: {text}", file=sys.stderr)
                    if kind == "error":
                        self.stop.value = 1  # one broken worker stops the producer

    def check_workers(self) -> None:
        """A worker that died without a word (killed, crashed) is reported, its region removed, the rest stopped."""
        for worker, p in enumerate(self.procs):
            if p.exitcode is None or p.exitcode == 0 or worker in self.reported:
                continue
            self.drain()  # it may have said why on its way out
            if worker in self.reported:
                continue
            self.reported.add(worker)
            if p.exitcode < 0:
                sig = -p.exitcode
                name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
                how = f"killed by {name}"
            else:
                how = f"exited with code {p.exitcode}"
            print(f"error: producer worker {worker}: {how}", file=sys.stderr, flush=True)
            self.stop.value = 1  # a producer short of a worker is not the producer asked for
