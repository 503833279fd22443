"""CPU seconds used by each input stage: producer process trees, and the trainer's threads by name.

Framework-neutral. Producers are separate processes: psutil reads each
one's CPU time together with its workers' (its process tree, those that
ended included). Inside the
trainer, stages are threads: Linux keeps each thread's CPU time and name
in /proc/self/task/<tid>/{stat,comm}, so a stage is the set of threads
whose name matches its pattern (the Python receive threads by the name they
were given, the native op's receive threads by the name its thread pool
gives them). Two snapshots, at the start and the end of the timed steps,
give each stage's CPU seconds over exactly that window.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field

import psutil

_TICK = os.sysconf("SC_CLK_TCK")

# Trainer-side input stages, by thread name (first match wins). The rest of the
# trainer's threads (the step itself, TensorFlow's executor) are the "trainer".
THREAD_STAGES: tuple[tuple[str, re.Pattern], ...] = (
    ("receive (op)", re.compile(r"zmq_pull")),  # the zmq_ops op's receive thread pool
    ("receive (python)", re.compile(r"Enqueue|QueueInput|feedbench-pull", re.I)),  # tensorpack's feeding thread
    ("tf.data", re.compile(r"^tf_data", re.I)),
    ("loader", re.compile(r"^feedbench-loader")),  # a --loader iterated in the trainer (core/loader_spec.py)
    ("decode (gpu-decode)", re.compile(r"^gpu-decode$")),  # gpu-decode's thread: decodes on the device, or the host
    ("receive (zmq io)", re.compile(r"^ZMQbg/(IO|Reaper)")),  # libzmq's I/O threads (consumer side)
)


def thread_times(pid: int | str = "self") -> dict[int, tuple[str, float]]:
    """{tid: (name, CPU seconds so far)} for every thread of a process (Linux /proc).

    In this process, a Python thread is named by its `threading` name (Linux only
    knows it as "python"); native threads keep the name they gave themselves.
    """
    out = {}
    py_names = {t.native_id: t.name for t in threading.enumerate()} if pid == "self" else {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended between listing and reading
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (py_names.get(int(tid), name), (int(fields[11]) + int(fields[12])) / _TICK)  # utime + stime
    return out


def stage_of(thread_name: str) -> str:
    for stage, pattern in THREAD_STAGES:
        if pattern.search(thread_name):
            return stage
    return "trainer"


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a process and every process it started, or None if it is gone.

    Alive processes count their own time; processes that already ended count
    in the time of the one that reaped them (the kernel adds a waited-for
    child's CPU to its parent's `children_*`, as RUSAGE_CHILDREN reports it).
    So a DataLoader's workers are counted even when they exit at the end of
    each pass (no `persistent_workers`), provided the loader joins them, as
    PyTorch's does.
    """
    return _tree_sum(pid, lambda p: sum(p.cpu_times()[:4]))  # user, system, children_user, children_system


def tree_rss_bytes(pid: int) -> int | None:
    """Resident memory of a process and every process it started (summed: pages they share count in each),
    or None if it is gone; the figure the timeline draws per stage."""
    return _tree_sum(pid, lambda p: p.memory_info().rss)


def _tree_sum(pid: int, figure) -> float | None:
    """`figure(process)` summed over a process and every process it started (one that ends meanwhile counts
    nothing), or None if the process is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += figure(p)
        except psutil.Error:
            continue
    return total


@dataclass
class Snapshot:
    at: float
    threads: dict[int, tuple[str, float]]
    producers: dict[int, float | None]
    process: float  # this whole process


@dataclass
class CpuMeter:
    """Snapshots the trainer's threads and the producers' process trees; `between` gives the use."""

    producer_pids: list[int] = field(default_factory=list)

    def snapshot(self) -> Snapshot:
        t = os.times()
        return Snapshot(
            time.perf_counter(),
            thread_times(),
            {pid: tree_cpu_seconds(pid) for pid in self.producer_pids},
            t.user + t.system,
        )

    @staticmethod
    def between(a: Snapshot, b: Snapshot, steps: int) -> dict:
        """CPU use over the window from `a` to `b` of `steps` steps: cores and seconds per step, per stage."""
        wall = b.at - a.at
        stages: dict[str, float] = {}
        names: dict[str, set[str]] = {}
        for tid, (name, cpu1) in b.threads.items():
            cpu0 = a.threads.get(tid, (name, 0.0))[1]
            stage = stage_of(name)
            stages[stage] = stages.get(stage, 0.0) + max(0.0, cpu1 - cpu0)
            names.setdefault(stage, set()).add(name)
        producers = []
        for i, pid in enumerate(b.producers):
            c0, c1 = a.producers.get(pid), b.producers.get(pid)
            if c0 is not None and c1 is not None:
                producers.append({"producer": i, "pid": pid, "cpu_s": max(0.0, c1 - c0)})
        per_step = max(1, steps)

        def fig(seconds: float) -> dict:
            return {
                "cpu_s": seconds,
                "cores": seconds / wall if wall > 0 else 0.0,
                "cpu_s_per_step": seconds / per_step,
            }

        out = {
            "window_s": wall,
            "steps": steps,
            "trainer_process": fig(max(0.0, b.process - a.process)),
            "threads": {s: {**fig(v), "thread_names": sorted(names[s])} for s, v in sorted(stages.items())},
            "producers": [{**r, **fig(r["cpu_s"])} for r in producers],
        }
        prod = sum(r["cpu_s"] for r in producers)
        receive = sum(v for s, v in stages.items() if s != "trainer")
        out["input"] = {
            "producers": fig(prod),
            "receive": fig(receive),
            "total": fig(prod + receive),
        }
        return out


def input_snapshot() -> tuple[float, float, float]:
    """(time, CPU seconds of every process this one started with theirs, CPU seconds of its input threads).

    In a PyTorch rank every process it starts feeds it (its producers, its DataLoader's workers), and its
    input threads are those `stage_of` names; the rest of its CPU is the trainer's.
    """
    procs = 0.0
    for child in psutil.Process().children():
        procs += tree_cpu_seconds(child.pid) or 0.0
    threads = sum(cpu for name, cpu in thread_times().values() if stage_of(name) != "trainer")
    return time.perf_counter(), procs, threads


def result_input_cores(result: dict) -> float | None:
    """The cores a path's input used over a result's timed windows, whichever trainer measured them: the
    TensorFlow trainer's meter (its input processes and receive threads, `telemetry.cpu`), else the PyTorch
    ranks' (the processes they started, a Ray cluster of their own among them, and their input threads,
    `input_cpu`, from `input_cores`); None where neither did."""
    meter = (((result.get("telemetry") or {}).get("cpu") or {}).get("input") or {}).get("total") or {}
    if meter.get("cores") is not None:
        return meter["cores"]
    return (result.get("input_cpu") or {}).get("cores")


def input_cores(a: tuple[float, float, float], b: tuple[float, float, float]) -> dict:
    """The input side's CPU cores between two `input_snapshot`s: its processes', its threads', and both."""
    wall = b[0] - a[0]
    if wall <= 0:
        return {"window_s": wall, "processes": 0.0, "threads": 0.0, "cores": 0.0}
    procs, threads = max(0.0, b[1] - a[1]) / wall, max(0.0, b[2] - a[2]) / wall
    return {"window_s": wall, "processes": procs, "threads": threads, "cores": procs + threads}
