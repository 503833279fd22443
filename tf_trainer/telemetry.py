"""Per-stage telemetry of one run: what each arrow of the walk delivered, sampled cheaply every step.

Input wait is measured from TensorFlow's own op timings: on a sample of the
measured steps (every `sample_every`-th), the step runs with
`RunOptions(trace_level=FULL_TRACE)` and the step's `RunMetadata.step_stats`
give each op's start and end. The input ops (queue dequeue, the zmq pull op,
tf.data's IteratorGetNext, StagingArea unstage) are the ones that block when
no batch is ready. A step waits for input only while such an op runs and no
other op does: that *exposed* input time, over the step's wall time, is the
input share of the step (the TensorFlow profiler's convention). Input ops
that run in parallel with compute cost nothing and are not counted.

Every step also fetches the FIFOQueue size (python-queue) and each tower's
StagingArea size, and reads the Python consumer's counters (messages, bytes,
latency from the producers' send timestamps). Producer rates come from the
producers' own telemetry: the native header extras on the Python paths, and
their progress lines on zmq-consume (the native op does not expose headers).
See docs/profiling.md for the overhead of all this.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import deque

from tensorpack.callbacks import Callback
from tensorpack.input_source import QueueInput, StagingInput

from tf_trainer.tf_env import tf

tf = tf()

# Ops that block the step while no batch is ready.
INPUT_OP_TYPES = frozenset(
    {
        "QueueDequeueV2",
        "QueueDequeueManyV2",
        "QueueDequeueUpToV2",
        "ZMQPull",
        "IteratorGetNext",
        "Unstage",
    }
)

_PROGRESS = re.compile(r"([\d.]+) img/s, ([\d.]+) MB/s, send latency ([\d.]+) ms")


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _subtract(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of the (merged) intervals `xs` not covered by the (merged) intervals `ys`."""
    out = []
    for a, b in xs:
        cur = a
        for c, d in ys:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
            if cur >= b:
                break
        if cur < b:
            out.append((cur, b))
    return out


def exposed_input_us(step_stats, input_ops: set[str]) -> tuple[int, int]:
    """(microseconds when only input ops ran, span of the step in microseconds) from one traced step."""
    inputs, others = [], []
    for dev in step_stats.dev_stats:
        for n in dev.node_stats:
            start = n.all_start_micros
            end = start + max(n.all_end_rel_micros, 1)
            name = n.node_name.split(":")[0]
            (inputs if name in input_ops else others).append((start, end))
    if not inputs and not others:
        return 0, 0
    every = inputs + others
    span = max(b for _, b in every) - min(a for a, _ in every)
    return _length(_subtract(_union(inputs), _union(others))), span


def parse_producer_progress(text: str) -> dict | None:
    """The last rate line a producer printed (its own counters), or None."""
    found = _PROGRESS.findall(text)
    if not found:
        return None
    ips, mbs, lat = (float(x) for x in found[-1])
    return {"images_per_sec": ips, "bytes_per_sec": mbs * 1e6, "send_latency_ms": lat}


def _find(source, kind):
    """The first input source of type `kind` in a chain of wrappers (StagingInput wraps another)."""
    s = source
    while s is not None:
        if isinstance(s, kind):
            return s
        s = getattr(s, "_input", None)
    return None


class Telemetry(Callback):
    """Samples every stage once per step; traces every `sample_every`-th measured step for input wait."""

    def __init__(
        self,
        source,
        warmup: int,
        images_per_step: int,
        batch: int,
        consumer=None,
        producers=None,
        sample_every: int = 4,
        total_steps: int | None = None,
        op_counters=None,
    ) -> None:
        self.source = source
        self.warmup = warmup
        self.images_per_step = images_per_step
        self.batch = batch
        self.consumer = consumer  # a PullConsumer (python paths), or a callable returning one
        self.producers = producers  # a ProducerGroup whose stderr holds progress lines (zmq-consume)
        self.op_counters = op_counters  # zmq-consume: the op's counters, `read(session)` (trainer/run.py)
        self.sample_every = max(1, sample_every)
        self.total_steps = total_steps  # known: read the consumer's counters at the last step only
        self.step = 0
        self.paused = False  # set by the profiler while its own trace runs (one trace at a time)
        self.queue_sizes: list[int] = []
        self.staging_sizes: list[float] = []
        self.walls: list[float] = []
        self.traced: list[tuple[float, float]] = []  # (exposed input ms, step wall ms)
        self.recent: deque[float] = deque(maxlen=8)
        self._wire0: tuple | None = None
        self._wire1: tuple | None = None

    # --- graph ---------------------------------------------------------------------------------
    def _setup_graph(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        self.input_ops = {op.name for op in graph.get_operations() if op.type in INPUT_OP_TYPES}
        fetches: dict = {}
        q = _find(self.source, QueueInput)
        self.queue_capacity = None
        if q is not None and q.queue is not None:
            with tf.name_scope("telemetry"):
                fetches["queue"] = q.queue.size()
            self.queue_capacity = int(q.queue._queue_ref.op.get_attr("capacity"))
        st = _find(self.source, StagingInput)
        self.towers_staged = 0
        if st is not None and st._areas:
            with tf.name_scope("telemetry"):
                fetches["staging"] = [a.size() for a in st._areas]
            self.towers_staged = len(st._areas)
        self._fetches = fetches

    # --- per step ------------------------------------------------------------------------------
    def _consumer(self):
        c = self.consumer() if callable(self.consumer) else self.consumer
        return c

    def _wire_snapshot(self, session) -> tuple | None:
        """(time, messages, bytes, latency s, wait s, {producer: received}); None where unknown."""
        c = self._consumer()
        if c is not None:
            received = {pid: pc.received for pid, pc in c.tracker.producers.items()}
            return (time.perf_counter(), c.batches, c.bytes, c.latency_s, c.wait_s, received)
        if self.op_counters is not None:
            # A run of its own (not a fetch of the training step), so the counters are read
            # exactly between steps; it costs well under a millisecond, twice per run.
            rows, messages, nbytes = self.op_counters.read(session)
            received = {r["producer"]: r["received"] for r in rows}
            return (time.perf_counter(), messages, nbytes, None, None, received)
        return None

    def measuring(self) -> bool:
        return self.step >= self.warmup

    def _before_run(self, ctx):
        self._t0 = time.perf_counter()
        if self.step == self.warmup:
            self._wire0 = self._wire_snapshot(ctx.session)
        self._tracing = self.measuring() and not self.paused and (self.step - self.warmup) % self.sample_every == 0
        options = None
        if self._tracing:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        return tf.compat.v1.train.SessionRunArgs(fetches=self._fetches, options=options)

    def _after_run(self, ctx, values) -> None:
        wall = time.perf_counter() - self._t0
        self.recent.append(wall)
        res = values.results or {}
        if self.measuring():
            self.walls.append(wall)
            if "queue" in res:
                self.queue_sizes.append(int(res["queue"]))
            if "staging" in res:
                self.staging_sizes.append(sum(int(x) for x in res["staging"]) / len(res["staging"]))
            if self._tracing and values.run_metadata is not None:
                exposed, _span = exposed_input_us(values.run_metadata.step_stats, self.input_ops)
                self.traced.append((exposed / 1e3, wall * 1e3))
            if self.total_steps is None or self.step == self.total_steps - 1:
                self._wire1 = self._wire_snapshot(ctx.session)
        self.step += 1

    # --- reading -------------------------------------------------------------------------------
    def live(self) -> str:
        """One short status line for a progress bar: images/s, queue occupancy, input wait."""
        parts = []
        if self.recent:
            parts.append(f"{self.images_per_step / statistics.mean(self.recent):.0f} img/s")
        if self.queue_sizes:
            parts.append(f"queue {self.queue_sizes[-1]}/{self.queue_capacity}")
        if self.traced:
            w, s = self.traced[-1]
            parts.append(f"input wait {100 * w / s:.0f}%")
        return ", ".join(parts)

    def _producers_summary(self) -> dict | None:
        c = self._consumer()
        rows = []
        source = None
        if c is not None and c.tracker.producers and self._wire0 and self._wire1:
            # Delivered rate: what arrived from each producer over the measured steps (consumer side,
            # exact); send latency: the producer's own figure over its last second (native header).
            source = "consumer counts + native headers"
            dt = self._wire1[0] - self._wire0[0]
            before, after = self._wire0[5], self._wire1[5]
            for pid, pc in sorted(c.tracker.producers.items()):
                got = after.get(pid, 0) - before.get(pid, 0)
                if dt > 0 and got > 0:
                    rows.append(
                        {
                            "producer": pid,
                            "images_per_sec": got * self.batch / dt,
                            "make_images_per_sec": float(pc.extras.get("make_images_per_sec", 0.0)),
                            "send_latency_ms": float(pc.extras.get("send_latency_ms", 0.0)),
                        }
                    )
        elif self.producers is not None:
            source = "producer progress lines"
            for i in range(len(self.producers.procs)):
                got = parse_producer_progress(self.producers.log_text(i))
                if got:
                    rows.append(
                        {
                            "producer": i,
                            "images_per_sec": got["images_per_sec"],
                            "send_latency_ms": got["send_latency_ms"],
                        }
                    )
        if not rows:
            return None
        ips = sum(r["images_per_sec"] for r in rows)
        # Share of each producer's time spent blocked in send (waiting for room under the HWM):
        # high means producers could give more, so the limit is downstream of them.
        shares = [
            r["send_latency_ms"] / 1e3 * r["images_per_sec"] / self.batch for r in rows if r["images_per_sec"] > 0
        ]
        return {
            "source": source,
            "count": len(rows),
            "images_per_sec": ips,
            "send_latency_ms": statistics.mean(r["send_latency_ms"] for r in rows),
            "send_wait_share": min(1.0, statistics.mean(shares)) if shares else None,
            "per_producer": rows,
        }

    def _wire_summary(self) -> dict | None:
        if self._wire0 is None or self._wire1 is None:
            return None
        t0, n0, b0, l0, w0, _ = self._wire0
        t1, n1, b1, l1, w1, _ = self._wire1
        dt, dn = t1 - t0, n1 - n0
        if dt <= 0 or dn <= 0:
            return None
        return {
            "messages_per_sec": dn / dt,
            "bytes_per_sec": (b1 - b0) / dt,
            # The op does not time its messages; only the Python consumer does.
            "latency_ms_mean": 1e3 * (l1 - l0) / dn if l0 is not None else None,
            "recv_wait_ms_mean": 1e3 * (w1 - w0) / dn if w0 is not None else None,
            "source": "consumer counters" if l0 is not None else "zmq_ops connection counters",
        }

    def summary(self) -> dict:
        """The telemetry block of a path's result (see docs/results.md)."""
        out: dict = {"sampled_steps": len(self.traced), "sample_every": self.sample_every}
        if self.traced:
            waits = [w for w, _ in self.traced]
            walls = [s for _, s in self.traced]
            out["input_wait_ms"] = {"mean": statistics.mean(waits), "max": max(waits)}
            out["input_wait_share"] = min(1.0, sum(waits) / sum(walls)) if sum(walls) > 0 else 0.0
        else:
            out["input_wait_ms"] = None
            out["input_wait_share"] = None
        if self.queue_sizes:
            cap = self.queue_capacity or 1
            out["queue"] = {
                "capacity": self.queue_capacity,
                "mean": statistics.mean(self.queue_sizes),
                "empty_share": sum(1 for q in self.queue_sizes if q == 0) / len(self.queue_sizes),
                "full_share": sum(1 for q in self.queue_sizes if q >= cap) / len(self.queue_sizes),
            }
        else:
            out["queue"] = None
        out["staging"] = (
            {"capacity": 1, "towers": self.towers_staged, "mean": statistics.mean(self.staging_sizes)}
            if self.staging_sizes
            else None
        )
        out["wire"] = self._wire_summary()
        out["producers"] = self._producers_summary()
        return out


class CpuUse(Callback):
    """CPU seconds of each input stage over the timed steps (profiler/cpu.py): producers, receive threads.

    Two snapshots, before the first timed step and after the last one; reading
    /proc and psutil twice costs a few milliseconds, outside the timed window's steps.
    """

    def __init__(self, warmup: int, total_steps: int, producers=None) -> None:
        self.warmup = warmup
        self.total_steps = total_steps
        self.producers = producers  # a ProducerGroup (its procs' pids), or None
        self.step = 0
        self._a = self._b = None

    def _meter(self):
        from profiler.cpu import CpuMeter

        pids = [p.pid for p in self.producers.procs] if self.producers is not None else []
        return CpuMeter(pids)

    def _before_run(self, ctx):
        if self.step == self.warmup:
            self.meter = self._meter()
            self._a = self.meter.snapshot()
        return None

    def _after_run(self, ctx, values) -> None:
        if self.step == self.total_steps - 1 and self._a is not None:
            self._b = self.meter.snapshot()
        self.step += 1

    def summary(self) -> dict | None:
        if self._a is None or self._b is None:
            return None
        return self.meter.between(self._a, self._b, self.total_steps - self.warmup)
