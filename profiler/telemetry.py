"""Each stage's figures as a named dict, computed from what the stage recorded (no framework imports).

The trainer side samples the stages (harness/tf/telemetry.py for TensorFlow)
and hands the raw samples here; the verdict (profiler/verdict.py) only reads
the dicts these functions return. The names and fields are the `telemetry`
block of docs/results.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from profiler.uncertainty import STEP_BATCHES, window_rate


def queue_figures(sizes: list[int], capacity: int) -> dict | None:
    """Occupancy of a queue sampled once per measured step."""
    if not sizes:
        return None
    cap = capacity or 1
    return {
        "capacity": capacity,
        "mean": statistics.mean(sizes),
        "empty_share": sum(1 for q in sizes if q == 0) / len(sizes),
        "full_share": sum(1 for q in sizes if q >= cap) / len(sizes),
    }


def staging_figures(sizes: list[float], capacity: int, towers: int) -> dict | None:
    """Mean batches waiting per tower's staging area, sampled once per measured step."""
    if not sizes:
        return None
    return {"capacity": capacity, "towers": towers, "mean": statistics.mean(sizes)}


def wire_figures(first: dict | None, last: dict | None) -> dict | None:
    """Rates between two counter snapshots ({time, messages, bytes, latency_s, wait_s, source})."""
    if first is None or last is None:
        return None
    dt, dn = last["time"] - first["time"], last["messages"] - first["messages"]
    if dt <= 0 or dn <= 0:
        return None
    timed = first["latency_s"] is not None
    return {
        "messages_per_sec": dn / dt,
        "bytes_per_sec": (last["bytes"] - first["bytes"]) / dt,
        # Only a consumer that times its messages (the Python one) gives latency and receive wait.
        "latency_ms_mean": 1e3 * (last["latency_s"] - first["latency_s"]) / dn if timed else None,
        "recv_wait_ms_mean": 1e3 * (last["wait_s"] - first["wait_s"]) / dn if first["wait_s"] is not None else None,
        "source": first["source"],
    }


def producer_figures(rows: list[dict], batch: int, source: str) -> dict | None:
    """The producers' figures from per-producer rows ({producer, images_per_sec, send_latency_ms, ...})."""
    if not rows:
        return None
    # Share of each producer's time spent blocked in send (waiting for room under the HWM):
    # high means producers could give more, so the limit is downstream of them.
    shares = [r["send_latency_ms"] / 1e3 * r["images_per_sec"] / batch for r in rows if r["images_per_sec"] > 0]
    return {
        "source": source,
        "count": len(rows),
        "images_per_sec": sum(r["images_per_sec"] for r in rows),
        "send_latency_ms": statistics.mean(r["send_latency_ms"] for r in rows),
        "send_wait_share": min(1.0, statistics.mean(shares)) if shares else None,
        **_stage_means(rows),
        "per_producer": rows,
    }


def stats_file_figures(ids: list[int], stats: list[dict | None], batch: int) -> dict | None:
    """The producers' figures from their own --stats-file (one per producer id, None where none was written)."""
    rows = [
        {"producer": pid, "images_per_sec": s["images_per_sec"], "send_latency_ms": s["send_latency_ms"]}
        for pid, s in zip(ids, stats, strict=True)
        if s is not None
    ]
    return producer_figures(rows, batch, "producer stats files")


def _stage_means(rows: list[dict]) -> dict:
    """`stage_ms`: a decoding producer's per-image time in each of its stages, averaged over producers."""
    stages = [r["stage_ms"] for r in rows if r.get("stage_ms")]
    if not stages:
        return {}
    return {"stage_ms": {k: statistics.mean(s.get(k, 0.0) for s in stages) for k in stages[0]}}


def delivered_rows(producers: dict, before: dict[int, int], batch: int, dt: float) -> list[dict]:
    """Per producer, what reached the consumer in `dt` seconds (exact counts) and what its headers said.

    `producers` is a consumer's tracker.producers ({id: counts with `received` and `extras`});
    `before` the `received` counts at the window's start. The rows feed `producer_figures`. `dt` is the trainer's
    timed window, whole steps from a step's start, so a producer's count in it is judged as the trainer's own
    rate is (profiler/uncertainty.py `window_rate`, STEP_BATCHES): a producer with no batch in it, or a window
    with no time, has no row ("not measured"), never a rate from a time near zero.
    """
    rows = []
    for pid, pc in sorted(producers.items()):
        got = pc.received - before.get(pid, 0)
        rate = window_rate(got * batch, dt, got, need=STEP_BATCHES)
        if rate is not None:
            rows.append(
                {
                    "producer": pid,
                    "images_per_sec": rate,
                    "make_images_per_sec": float(pc.extras.get("make_images_per_sec", 0.0)),
                    "send_latency_ms": float(pc.extras.get("send_latency_ms", 0.0)),
                }
            )
            if isinstance(pc.extras.get("stage_ms"), dict):  # the decode producer's per-stage times
                stages = pc.extras["stage_ms"].items()  # from the wire: numbers only
                rows[-1]["stage_ms"] = {str(k): float(v) for k, v in stages if isinstance(v, int | float)}
    return rows


def delivered_figures(producers: dict, before: dict[int, int], batch: int, dt: float) -> dict | None:
    """The producers' figures from a consumer's exact counts and the native headers' extras (`delivered_rows`)."""
    return producer_figures(delivered_rows(producers, before, batch, dt), batch, "consumer counts + native headers")


@dataclass
class SampledQueue:
    """A queue whose occupancy the trainer records once per measured step (the torch prefetch queue)."""

    sizes: list[int]
    capacity: int
    name: str = "queue"

    def figures(self) -> dict | None:
        return queue_figures(self.sizes, self.capacity)


@dataclass
class DescribedStage:
    """A stage reported by what it is, not by what it counted (the decoder a pipeline runs)."""

    name: str
    fields: dict = field(default_factory=dict)

    def figures(self) -> dict:
        return dict(self.fields)


def stage_figures(path: Any, first: dict | None, last: dict | None) -> dict[str, dict]:
    """Every stage's figures for a path, the same for both frameworks (the `telemetry` block's stages).

    `path` is a core.registry.InputPath: its `sampled_stages()` (objects with `name` and `figures()`) and
    `producer_figures(window)`; `first` and `last` its `counters()` at the measured window's edges.
    Stages with nothing to report are left out.
    """
    out: dict = {s.name: s.figures() for s in path.sampled_stages()}
    out["wire"] = wire_figures(first, last)
    out["producers"] = path.producer_figures((first, last) if first and last else None)
    return {k: v for k, v in out.items() if v is not None}


def input_wait_figures(traced: list[tuple[float, float]]) -> dict:
    """From (exposed input ms, step wall ms) of the traced steps: the wait per step and its share of the step."""
    if not traced:
        return {"input_wait_ms": None, "input_wait_share": None}
    waits = [w for w, _ in traced]
    walls = [s for _, s in traced]
    return {
        "input_wait_ms": {"mean": statistics.mean(waits), "max": max(waits)},
        "input_wait_share": min(1.0, sum(waits) / sum(walls)) if sum(walls) > 0 else 0.0,
    }


def add_common_fields(result: dict, cfg, description: dict) -> None:
    """What every trainer's result holds beside its timing: the sizes, the emulation label, the path's words.

    `cfg` is the run's BenchConfig; `description` the path's `InputPath.describe()`. With telemetry on,
    the `trainer` stage repeats the headline figures, so the verdict reads one block.
    """
    result["bytes_per_image"] = cfg.image_size * cfg.image_size * 3 + 4  # uint8 RGB and an int32 label
    result["batch"] = cfg.batch
    if cfg.model == "emulated":
        result["emulated"] = dict(cfg.emulation)  # every emulated figure carries its label
    result["input"] = description
    if result.get("telemetry") is not None:
        result["telemetry"]["trainer"] = {
            "images_per_sec": result["images_per_sec"]["median"],
            "images_per_sec_per_device": result["images_per_sec_per_device"]["median"],
            "step_time_ms": result["step_time_ms"],
        }


def _mean_known(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def merge_rank_stages(stages: list[dict]) -> dict:
    """Every rank's stage figures as one: queue figures averaged, wire and producer rates summed.

    A stage only some paths have (a decoder's description) is kept as rank 0 gave it.
    """
    out: dict = {"queue": None, "staging": None, "wire": None, "producers": None}
    out.update({k: v for k, v in (stages[0] if stages else {}).items() if k not in out})
    qs = [r["queue"] for r in stages if r.get("queue")]
    if qs:
        out["queue"] = {k: (qs[0][k] if k == "capacity" else sum(q[k] for q in qs) / len(qs)) for k in qs[0]}
    ws = [r["wire"] for r in stages if r.get("wire")]
    if ws:
        out["wire"] = {
            "messages_per_sec": sum(w["messages_per_sec"] for w in ws),
            "bytes_per_sec": sum(w["bytes_per_sec"] for w in ws),
            "latency_ms_mean": _mean_known(w["latency_ms_mean"] for w in ws),
            "recv_wait_ms_mean": _mean_known(w["recv_wait_ms_mean"] for w in ws),
            "source": ws[0]["source"],
        }
    ps = [r["producers"] for r in stages if r.get("producers")]
    if ps:
        shares = [p["send_wait_share"] for p in ps if p["send_wait_share"] is not None]
        out["producers"] = {
            "source": ps[0]["source"],
            "count": sum(p["count"] for p in ps),
            "images_per_sec": sum(p["images_per_sec"] for p in ps),
            "send_latency_ms": sum(p["send_latency_ms"] for p in ps) / len(ps),
            "send_wait_share": sum(shares) / len(shares) if shares else None,
            "per_producer": [row for p in ps for row in p["per_producer"]],
        }
    return out


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
    """(microseconds when only input ops ran, span of the step in microseconds) from one traced step.

    `step_stats` is a RunMetadata.step_stats protobuf; only its fields are read.
    """
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
