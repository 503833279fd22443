"""Name the stage that limits a run, with the evidence, from its telemetry.

Two published rules, applied in order:

1. The TensorFlow profiler's input-pipeline convention: the share of step
   time spent waiting for input decides the level: 20% or more is HIGHLY
   input-bound, 5% or more moderately input-bound, less is not input-bound.
2. tensorpack's rule of thumb for where the limit sits: a queue that is near
   empty means the input is the bottleneck; a full queue with producers whose
   send latency is high (they wait for room) means the trainer is.

When the input is the limit, the producers' own figures say which side of
the wire: producers that rarely wait to send are working flat out (the
producer limits); producers that mostly wait to send could give more, so
the consumer (receive, deserialise, copy into the graph) limits.
"""

from __future__ import annotations

import math

from tabulate import tabulate

from core.registry import BASELINE, InputPath
from profiler.attribution import add_attribution, sentence

HIGH, MODERATE = 0.20, 0.05
LEVELS = ("HIGHLY input-bound", "moderately input-bound", "not input-bound", "not measured")
# Producers blocked in send more than this share of their time have room to give more.
SEND_WAIT_BUSY = 0.5

# What the verdict says about a path that did not describe itself (its result has no "input").
_GENERIC = InputPath(None).describe()


def level_of(share: float | None) -> str:
    """The TensorFlow profiler's level for an input share of step time."""
    if share is None:
        return LEVELS[3]
    if share >= HIGH:
        return LEVELS[0]
    if share >= MODERATE:
        return LEVELS[1]
    return LEVELS[2]


def _queue_words(q: dict | None) -> str | None:
    if not q:
        return None
    return (
        f"queue holds {q['mean']:.1f} of {q['capacity']} on average "
        f"(empty {100 * q['empty_share']:.0f}% of steps, full {100 * q['full_share']:.0f}%)"
    )


def verdict(path: str, result: dict, baseline_ips: float | None = None) -> dict:
    """The verdict for one path's result (which holds "telemetry" and "input"); see docs/profiling.md."""
    tel = result.get("telemetry") or {}
    share = tel.get("input_wait_share")
    level = level_of(share)
    evidence: list[str] = []
    if share is not None:
        evidence.append(f"waits {100 * share:.0f}% of each step for input")
    else:
        evidence.append("input wait not measured (--no-telemetry)")
    if path == BASELINE:
        return {
            "level": level,
            "limiting_stage": "trainer",
            "evidence": "; ".join(evidence + ["data already on the device: the baseline"]),
            "advice": "this is the ceiling the other paths are measured against",
        }
    q = tel.get("queue")
    queue_empty = q is not None and q["empty_share"] >= 0.5
    if level in LEVELS[:2] or (level == LEVELS[3] and queue_empty):
        stage, advice = _input_limits(result, evidence, baseline_ips)
        advice = _not_this_path(path, advice)
        if queue_empty:
            evidence.append(_queue_words(q) + ": starved")
        return {"level": level, "limiting_stage": stage, "evidence": "; ".join(evidence), "advice": advice}
    stage, advice = _trainer_limits(result, evidence, baseline_ips)
    if level == LEVELS[3]:
        advice = "run with telemetry on to name the limiting stage"
        stage = "unknown"
    return {"level": level, "limiting_stage": stage, "evidence": "; ".join(evidence), "advice": advice}


def _busy(prod: dict | None) -> bool:
    """Producers blocked in send most of their time: they could give more."""
    return prod is not None and prod.get("send_wait_share") is not None and prod["send_wait_share"] >= SEND_WAIT_BUSY


def _not_this_path(path: str, advice: str) -> str:
    """Advice never tells a run to switch to the path it is already on."""
    if f"use {path}" not in advice:
        return advice
    parts = [p for p in advice.replace(", or ", "; ").replace(" or ", "; ").split("; ") if f"use {path}" not in p]
    return " or ".join(parts) if parts else "speed up the producers"


def _producer_advice(feeder: dict | None, prod: dict, baseline_ips: float | None, ips: float) -> str:
    """What to do when the producers limit, in terms of who they are: the user's loader, an external one, ours."""
    need = f"{baseline_ips:.0f} img/s" if baseline_ips else "more"
    kind = (feeder or {}).get("kind")
    if kind == "external":
        return (
            f"{feeder['name']} delivers {prod['images_per_sec']:.0f} img/s; it would need {need} to keep up: "
            "add workers or producers on that side"
        )
    if kind == "loader":
        workers = max(1, feeder.get("workers") or 1)
        per_worker = prod["images_per_sec"] / workers
        needed = math.ceil(baseline_ips / per_worker) if baseline_ips and per_worker > 0 else None
        how = f"about {needed} workers (--producers x --producer-workers; now {workers})" if needed else "more workers"
        return (
            f"{feeder['name']} limits at {per_worker:.0f} img/s per worker: run {how}, or speed up its slowest "
            f"stage (bench_input.py --loader {feeder['loader']} --loader-only names it)"
        )
    return "add producers (--producers) or workers (--producer-workers), or use DALI"


def _input_limits(result: dict, evidence: list[str], baseline_ips: float | None) -> tuple[str, str]:
    """The input limits: the producers' figures say which side of the wire (stage, advice)."""
    prod = (result.get("telemetry") or {}).get("producers")
    words = result.get("input") or _GENERIC
    feeder = words.get("feeder")
    ips = result["images_per_sec"]["median"]
    against = f" against {baseline_ips:.0f} img/s with on-device data" if baseline_ips else ""
    who = feeder["name"] if feeder and feeder["kind"] in ("loader", "external") else "producers"
    if prod is not None and not _busy(prod):
        evidence.append(
            f"{who} deliver{'s' if who != 'producers' else ''} {prod['images_per_sec']:.0f} img/s{against}, "
            f"waiting to send only {100 * (prod['send_wait_share'] or 0):.0f}% of their time"
        )
        return "producer", _producer_advice(feeder, prod, baseline_ips, ips)
    if prod is not None:
        evidence.append(
            f"producers wait to send {100 * prod['send_wait_share']:.0f}% of their time "
            f"(send latency {prod['send_latency_ms']:.0f} ms): they could give more"
        )
        return "consumer", words["advice"]
    evidence.append(f"{words['delivers_words']} {ips:.0f} img/s{against}")
    if feeder and feeder["kind"] == "external":
        need = f"{baseline_ips:.0f} img/s" if baseline_ips else "more"
        return "input", (
            f"{feeder['name']} (or the wire to it) delivers {ips:.0f} img/s and would need {need}: "
            "add workers or producers on that side"
        )
    if feeder and feeder["kind"] == "loader":
        return "input", _producer_advice(feeder, {"images_per_sec": ips}, baseline_ips, ips)
    return "input", words["input_advice"]


def _trainer_limits(result: dict, evidence: list[str], baseline_ips: float | None) -> tuple[str, str]:
    """The input keeps up: the trainer sets the pace, unless the input slows the steps down (stage, advice)."""
    tel = result.get("telemetry") or {}
    q, prod = tel.get("queue"), tel.get("producers")
    ips = result["images_per_sec"]["median"]
    if q is not None and q["full_share"] >= 0.5:
        evidence.append(_queue_words(q) + ": the input keeps ahead")
    if _busy(prod):
        evidence.append(
            f"producers wait to send {100 * prod['send_wait_share']:.0f}% of their time "
            f"(send latency {prod['send_latency_ms']:.0f} ms): the trainer sets the pace"
        )
    advice = "the input keeps up: a faster model step (fp16, XLA, more devices) is what would help"
    if baseline_ips:
        evidence.append(f"{ips:.0f} img/s against {baseline_ips:.0f} img/s with on-device data")
        if ips < 0.8 * baseline_ips:
            # Slower than the baseline without waiting: the input's host work competes with the step.
            evidence.append("steps are slower without waiting for input: the input competes for the host CPU")
            advice = (result.get("input") or _GENERIC)["host_cpu_advice"]
    return "trainer", advice


def add_verdicts(results: dict[str, dict]) -> None:
    """Give every path its verdict, against the baseline of the same invocation."""
    base = results.get(BASELINE)
    base_ips = base["images_per_sec"]["median"] if base else None
    for path, r in results.items():
        r["verdict"] = verdict(path, r, base_ips)
    add_attribution(results)  # and split each gap into waiting and slower steps (profiler/attribution.py)


def line(path: str, v: dict) -> str:
    """One sentence: `path: LEVEL — evidence; advice`."""
    return f"{path}: {v['level']} — {v['evidence']}; {v['advice']}"


def table(results: dict[str, dict]) -> str:
    """The verdict table printed after the results table; the evidence follows, one line per path."""
    rows = []
    for path, r in results.items():
        v = r.get("verdict")
        if not v:
            continue
        tel = r.get("telemetry") or {}
        share = tel.get("input_wait_share")
        rows.append(
            [
                path,
                v["level"],
                "n/a" if share is None else f"{100 * share:.0f}%",
                v["limiting_stage"],
            ]
        )
    return tabulate(
        rows,
        headers=["input path", "verdict", "input wait", "limiting stage"],
        disable_numparse=True,
    )


def verdicts_text(results: dict[str, dict]) -> str:
    """Give every path its verdict and attribution; the verdict table, then one line of each per path.

    What both trainers print after their results table.
    """
    add_verdicts(results)
    verdicts = "\n".join(line(path, r["verdict"]) for path, r in results.items())
    gaps = "\n".join(sentence(path, r.get("attribution")) for path, r in results.items())
    return f"{table(results)}\n\n{verdicts}\n\n{gaps}"
