"""The run's timeline: per stage, once a second, CPU cores, resident memory and images/s (timeline.json).

Framework-neutral. A thread of the run's own process (bench_input.py) walks
its process tree once a second with psutil and puts each process in a stage:
a producer (`python -m producers ...`) and everything under it is
"producers"; every other process (this one, torchrun's ranks, their
DataLoader workers; the loader's workers under --loader-only) is the stage
the run names (`main_stage`). The producers' sent images/s comes from the
`--stats-file` each one rewrites once a second (named on its command line).

The trainer's delivered images/s and the shaded timed windows come from the
trainers' own step clocks, handed over after each path (`add_clock`): both
trainers time steps with time.perf_counter, CLOCK_MONOTONIC on Linux, the
same clock in every process of this host, so the parent can place a rank's
steps on its own seconds. Times in the document are seconds since the
sampler started. Drawing it is profiler/timeline_plot.py's job.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable

import psutil

from profiler.uncertainty import STEP_BATCHES, window_rate

INTERVAL_S = 1.0
PRODUCERS = "producers"


def _is_producer(cmdline: list[str]) -> bool:
    """`python -m producers ...`: a producer process (its workers are found as its children)."""
    return any(a == "producers" and i > 0 and cmdline[i - 1] == "-m" for i, a in enumerate(cmdline))


def _stats_file(cmdline: list[str]) -> str | None:
    for i, a in enumerate(cmdline[:-1]):
        if a == "--stats-file":
            return cmdline[i + 1]
    return None


def _sent_rate(path: str | None) -> float:
    """A producer's images/s over its last second, from its stats file (0 before it wrote one)."""
    if not path:
        return 0.0
    try:
        with open(path) as f:
            return float(json.load(f).get("images_per_sec", 0.0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0


class Timeline:
    """Samples the run's process tree once a second; `with Timeline("trainer") as t: ...`, then `t.document()`.

    `counters`: {stage: a function returning (images, batches) delivered so far}, sampled with the rest (a
    stage without a step clock, such as --loader-only's workers, gets its images/s from it).
    """

    def __init__(self, main_stage: str, interval: float = INTERVAL_S) -> None:
        self.main_stage = main_stage
        self.interval = interval
        self.counters: dict[str, Callable[[], tuple[float, float]]] = {}
        # {stage: a function returning that second's figures}, e.g. "gpu": the GPUs' clocks and power
        # (profiler/gpu_state.py), a row of its own in the picture.
        self.gauges: dict[str, Callable[[], dict]] = {}
        self.samples: list[dict] = []
        self.windows: list[dict] = []  # {"label", "start", "end"}: the timed windows, shaded in the picture
        self._steps: list[tuple[float, int]] = []  # (monotonic end of a step, images it delivered)
        self._queue: list[tuple[float, int]] = []  # (monotonic end of a step, batches its queue held)
        self._pid = os.getpid()
        self._procs: dict[int, psutil.Process] = {}
        # CPU seconds of each process (and its reaped children) at the last sample, and when they were read.
        self._cpu: dict[int, tuple[float, float]] = {}
        self._parent: dict[int, int] = {}  # each process's parent at the last sample
        self._parent_now: dict[int, int] = {}  # ... and at the sample being taken
        self._last = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = time.perf_counter()
        self.started = time.time()
        self.cores = os.cpu_count() or 1

    def __enter__(self) -> Timeline:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.t0, self.started = time.perf_counter(), time.time()
        self._sample()  # each process's CPU seconds so far; the first row follows a second later
        self.samples.clear()
        self._thread = threading.Thread(target=self._run, name="feedbench-timeline", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling, with a last (partial-second) sample so the run's end is in the timeline."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.samples.append(self._sample())

    def _run(self) -> None:
        while not self._stop.wait(self.interval - (time.perf_counter() - self.t0) % self.interval):
            self.samples.append(self._sample())

    def _tree(self) -> list[tuple[psutil.Process, str, str | None]]:
        """(process, stage, its producer's stats file) for this process and every descendant.

        One scan of /proc for the whole tree (psutil's recursive children: parents come before their own).
        A child that ended but is not yet reaped (a zombie) stays in: its CPU moves to its parent only
        when the parent reaps it, and until then it is counted where it was.
        """
        me = self._procs.setdefault(self._pid, psutil.Process(self._pid))
        out, stage_of = [(me, self.main_stage, None)], {self._pid: self.main_stage}
        self._parent_now = {}
        try:
            children = me.children(recursive=True)
        except psutil.Error:
            return out
        for c in children:
            c = self._procs.setdefault(c.pid, c)  # the same object each second: psutil checks it is the same
            try:
                parent = c.ppid()
                try:
                    cmd = c.cmdline()
                except psutil.ZombieProcess:
                    cmd = []
            except psutil.Error:
                continue
            self._parent_now[c.pid] = parent
            stage = stage_of.get(parent, self.main_stage)
            producer = stage != PRODUCERS and _is_producer(cmd)
            stage_of[c.pid] = PRODUCERS if producer else stage
            out.append((c, stage_of[c.pid], _stats_file(cmd) if producer else None))
        return out

    def _read(self, tree: list) -> list[tuple[psutil.Process, str, str | None, float, float, float]]:
        """(process, stage, stats file, CPU seconds, resident bytes, when read) of each process read now.

        A process's CPU is its own and that of the children it reaped (a DataLoader's workers that end with
        each pass). One that cannot be read but is still there keeps its last reading, so that its CPU,
        counted before, is taken off its parent when the parent reaps it.
        """
        before, self._cpu = self._cpu, {}
        got = []
        for proc, stage, stats in tree:
            try:
                with proc.oneshot():
                    times, rss = proc.cpu_times(), proc.memory_info().rss
            except psutil.Error:
                if proc.pid in before and proc.is_running():
                    self._cpu[proc.pid] = before[proc.pid]
                continue
            at = time.perf_counter()
            cpu = times.user + times.system + times.children_user + times.children_system
            self._cpu[proc.pid] = (cpu, at)
            got.append((proc, stage, stats, cpu, rss, at))
        return got

    def _sample(self) -> dict:
        """One row: per stage, CPU cores over the last second, resident MB, processes (and sent images/s).

        Each process's CPU rise is divided by the time between its own two readings: a second that
        stretched under load (reading the tree took long, or the next row came early to keep the beat)
        is divided by its real length, so the row never holds more CPU than the machine's cores ran.
        """
        stages: dict[str, dict] = {self.main_stage: _empty()}
        tree = self._tree()
        now = time.perf_counter()
        span, self._last = now - self._last, now
        self._procs = {p.pid: p for p, _, _ in tree}  # forget processes that ended
        before = self._cpu
        got = self._read(tree)
        # What an ended process had already been counted with is taken off its reaper's rise.
        counted = _reaped({pid: c for pid, (c, _) in before.items()}, self._parent, set(self._cpu))
        self._parent = self._parent_now
        for proc, stage, stats, cpu, rss, at in got:
            # A process first seen now started since the last row: all its CPU is this row's.
            cpu0, at0 = before.get(proc.pid, (0.0, at - span))
            rise = cpu - cpu0 - counted.get(proc.pid, 0.0)
            s = stages.setdefault(stage, _empty())
            s["cpu_cores"] += max(0.0, rise) / (at - at0) if at > at0 else 0.0
            s["rss_mb"] += rss / 1e6
            s["processes"] += 1
            if stats:
                s["sent_images_per_sec"] = s.get("sent_images_per_sec", 0.0) + _sent_rate(stats)
        for stage, gauge in list(self.gauges.items()):
            stages.setdefault(stage, {}).update(gauge())
        for stage, count in list(self.counters.items()):
            try:
                images, batches = count()
                stages.setdefault(stage, _empty())["images_so_far"] = (float(images), float(batches))
            except Exception:  # a counter whose source is gone (a point's workers ended): no figure this second
                pass
        return {"t": now - self.t0, "stages": stages}

    def add_clock(self, label: str, clock: dict | None) -> None:
        """A path's step clock (a trainer's result `clock`): its steps' images and its timed windows."""
        if not clock:
            return
        self.add_steps(clock["step_ends"], [int(clock["images_per_step"])] * len(clock["step_ends"]))
        self._queue += [(float(t), int(n)) for t, n in clock.get("queue") or []]
        for start, end in clock["windows"]:
            self.add_window(label, start, end)

    def add_steps(self, ends: list[float], images: list[int]) -> None:
        """Batches delivered: each one's end (perf_counter or time.monotonic seconds of this host), its images."""
        self._steps += [(float(t), int(n)) for t, n in zip(ends, images)]

    def add_window(self, label: str, start: float, end: float) -> None:
        """A timed window, in perf_counter seconds of this host."""
        self.windows.append({"label": label, "start": start - self.t0, "end": end - self.t0})

    def document(self) -> dict:
        """The timeline: one row a second, each stage's figures, the delivered rate, the windows."""
        names = sorted({s for r in self.samples for s in r["stages"]}, key=lambda s: (s == PRODUCERS, s))
        # Every stage in every row: a stage with no process that second (producers between paths) has zeros.
        rows = [dict(r, stages={k: dict(r["stages"].get(k) or _empty()) for k in names}) for r in self.samples]
        _rates(rows, sorted((t - self.t0, n) for t, n in self._steps), self.main_stage, self.interval)
        _per_row(rows, sorted((t - self.t0, n) for t, n in self._queue), self.main_stage, "queue_occupancy", _mean)
        _counted(rows, self.interval)
        _within_cores(rows, self.cores)
        return {
            "interval_s": self.interval,
            "machine_cores": self.cores,
            "started": self.started,
            "stages": names,
            "samples": rows,
            "windows": sorted(self.windows, key=lambda w: w["start"]),
        }


def _reaped(cpu: dict[int, float], parent: dict[int, int], alive: set[int]) -> dict[int, float]:
    """{living process: CPU seconds already counted for its descendants that ended since the last sample}.

    An ended process's CPU moves into the `children_*` of the one that reaped it (its parent, or the
    nearest living ancestor when the parent ended too): that part was counted before and must not be again.
    """
    counted: dict[int, float] = {}
    for pid, seconds in cpu.items():
        if pid in alive:
            continue
        up = parent.get(pid)
        while up is not None and up not in alive:
            up = parent.get(up)
        if up is not None:
            counted[up] = counted.get(up, 0.0) + seconds
    return counted


def _empty() -> dict:
    return {"cpu_cores": 0.0, "rss_mb": 0.0, "processes": 0}


def _rates(rows: list[dict], events: list[tuple[float, int]], stage: str, interval: float) -> None:
    """Each row's delivered images/s of `stage`: the images of the steps that ended since the row before, over
    that time (`_share_rates`). Every image is in some row's rate times its length."""
    if not events:
        return
    spans, i, before = [], 0, 0.0  # per row: (from, to, images, batches)
    for r in rows:
        images = batches = 0
        while i < len(events) and events[i][0] <= r["t"]:
            images, batches, i = images + events[i][1], batches + 1, i + 1
        spans.append((before, r["t"], images, batches))
        before = r["t"]
    _share_rates([r["stages"][stage] for r in rows], spans, interval)


def _share_rates(figures: list[dict], spans: list[tuple[float, float, float, float]], interval: float) -> None:
    """Each row's `images_per_sec` from its span (from, to, images, batches), through profiler/uncertainty.py
    `window_rate` (one batch at least: a row with none is not measured and drawn as nothing). A row shorter than
    half the interval (one that came early to keep the beat after a late one, or the run's last, partial
    second) is joined with the next (the last with the one before), and the rows joined share their rate: a
    batch that ended in a tenth of a second is never ten batches a second."""
    groups: list[list[int]] = []
    for k in range(len(spans)):
        if groups and spans[groups[-1][-1]][1] - spans[groups[-1][0]][0] < interval / 2:
            groups[-1].append(k)
        else:
            groups.append([k])
    if len(groups) > 1 and spans[groups[-1][-1]][1] - spans[groups[-1][0]][0] < interval / 2:
        last = groups.pop()
        groups[-1] += last
    for g in groups:
        seconds = spans[g[-1]][1] - spans[g[0]][0]
        batches = int(sum(spans[k][3] for k in g))
        rate = window_rate(sum(spans[k][2] for k in g), seconds, batches, need=STEP_BATCHES)
        if rate is None:
            continue
        for k in g:
            figures[k]["images_per_sec"] = rate


def _mean(values: list[int], seconds: float) -> float | None:
    return sum(values) / len(values) if values else None


def _per_row(rows: list[dict], events: list[tuple[float, int]], stage: str, key: str, fold: Callable) -> None:
    """Each row's `key` of `stage`: `fold` of the events (sorted times, values) since the previous row."""
    if not events:
        return
    i, before = 0, 0.0
    for r in rows:
        values = []
        while i < len(events) and events[i][0] <= r["t"]:
            values.append(events[i][1])
            i += 1
        if (v := fold(values, r["t"] - before)) is not None:
            r["stages"][stage][key] = v
        before = r["t"]


def _within_cores(rows: list[dict], cores: int) -> None:
    """No row holds more CPU than the machine has cores: the kernel counts CPU time in ticks (10 ms), so
    a second's readings of many processes can round up past it; such a row's stages are scaled to fit."""
    for r in rows:
        cpu = [s for s in r["stages"].values() if "cpu_cores" in s]  # a GPU's row (profiler/gpu_state.py) has none
        total = sum(s["cpu_cores"] for s in cpu)
        if total > cores:
            for s in cpu:
                s["cpu_cores"] *= cores / total


def _counted(rows: list[dict], interval: float) -> None:
    """Images/s of a stage sampled by a counter ((images, batches) so far): each row's rise since the one before
    it that read the counter, shared with its neighbour where the row is short (`_share_rates`)."""
    read: dict[str, list[tuple[dict, tuple[float, float, float, float]]]] = {}
    last: dict[str, tuple[float, float, float]] = {}
    for r in rows:
        for stage, s in r["stages"].items():
            if "images_so_far" not in s:
                continue
            n, b = s.pop("images_so_far")
            t0, n0, b0 = last.get(stage, (0.0, 0.0, 0.0))
            read.setdefault(stage, []).append((s, (t0, r["t"], max(0.0, n - n0), max(0.0, b - b0))))
            last[stage] = (r["t"], n, b)
    for got in read.values():
        _share_rates([s for s, _ in got], [span for _, span in got], interval)


def out_files(doc: dict) -> dict[str, str | bytes]:
    """{"timeline.json": ..., "timeline.png": ...}: written with the run's other --out files, all or none."""
    from profiler.timeline_plot import timeline_png

    return {"timeline.json": json.dumps(doc, indent=1), "timeline.png": timeline_png(doc)}


def take_clocks(results: dict[str, dict] | None, timeline: Timeline | None) -> None:
    """Move each path's step clock out of its result (the report has no place for it) into `timeline`."""
    for path, r in (results or {}).items():
        clock = r.pop("clock", None)
        if timeline is not None:
            timeline.add_clock(path, clock)
