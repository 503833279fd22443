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

Before either rule, the figures must say there is something to explain: a
path whose ratio to the baseline is within noise (profiler/uncertainty.py)
gets "same as baseline (within noise)", no limiting stage and no advice but
how long a run would tell. Every claim names its figure: a path slower than
the baseline without waiting is said to compete for the host CPU only when
its input measurably used CPU; otherwise the gap is called unexplained.
"""

from __future__ import annotations

import math
import os
import re

from tabulate import tabulate

from core.registry import BASELINE, InputPath
from profiler.attribution import add_attribution, sentence, too_short
from profiler.summary import drained, rate_figure
from profiler.training import invalid_reason, invalid_words
from profiler.uncertainty import WITHIN_NOISE, baseline_for, uncertainty

HIGH, MODERATE = 0.20, 0.05
LEVELS = ("HIGHLY input-bound", "moderately input-bound", "not input-bound", "not measured", WITHIN_NOISE)
# Below this many cores, the input's host work cannot be what slows the steps.
INPUT_CORES_SMALL = 0.1
# A result whose model did not train (profiler/training.py): its figures, and so its verdict, stand for nothing.
INVALID_ADVICE = (
    "no figure from a model that does not train: lower --learning-rate or raise --warmup-steps, and see which "
    "window went wrong in the result's `training` block"
)
# What makes the model's step faster, per framework (the result's, or the caller's).
FASTER_STEP = {
    "tf": "fp16 (--use-fp16), XLA (--use-xla-compile), more devices",
    "tensorflow": "fp16 (--use-fp16), XLA (--use-xla-compile), more devices",
    "torch": "fp16 autocast (--use-fp16), more devices",
    None: "fp16 (--use-fp16), more devices",
}
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


def framework_of(result: dict, framework: str | None = None) -> str | None:
    """The trainer a result came from: the caller's word, else the result's own `framework` (or its input's)."""
    return framework or result.get("framework") or (result.get("input") or {}).get("framework")


def verdict(path: str, result: dict, baseline_ips: float | None = None, framework: str | None = None) -> dict:
    """The verdict for one path's result (which holds "telemetry" and "input"); see docs/profiling.md."""
    v = _verdict(path, result, baseline_ips, framework_of(result, framework))
    if path != BASELINE:
        v["advice"] = _not_this_path(path, v["advice"])
    return v


def _within_noise(path: str, result: dict, evidence: list[str]) -> dict:
    """A path the run cannot tell from the baseline: no limit, no advice but how long a run would tell."""
    u = result["uncertainty"]
    lo, hi = u["ratio"]
    ratio = result.get("ratio_to_baseline")
    pairs = (result.get("interleaved") or {}).get("pairs")
    # With --interleave N the interval is that of the N paired ratios, not of the path's own windows.
    over = f"{pairs} pairs of alternating runs (--interleave {pairs})" if pairs else f"{u['windows']} windows"
    evidence.append(
        f"{ratio:.2f} of the baseline, interval {lo:.2f}–{hi:.2f} over {over} holds 1.0"
        if ratio is not None
        else f"ratio interval {lo:.2f}–{hi:.2f} holds 1.0"
    )
    advice = too_short(result, u) or "nothing to change on this evidence: no difference from the baseline to explain"
    return {"level": WITHIN_NOISE, "limiting_stage": "none", "evidence": "; ".join(evidence), "advice": advice}


def _verdict(path: str, result: dict, baseline_ips: float | None, framework: str | None) -> dict:
    if bad := invalid_reason(result):  # a model that does not train gives no figure, so no verdict on one
        return {"level": "invalid", "limiting_stage": "none", "evidence": bad, "advice": INVALID_ADVICE}
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
            # The baseline's own words, as its declaration says them (the result's `input` block carries them).
            "advice": (result.get("input") or {}).get("advice") or "",
        }
    if (result.get("uncertainty") or {}).get("within_noise"):
        return _within_noise(path, result, evidence)
    q = tel.get("queue")
    queue_empty = q is not None and q["empty_share"] >= 0.5
    if level in LEVELS[:2] or (level == LEVELS[3] and queue_empty):
        stage, advice = _input_limits(result, evidence, baseline_ips)
        if queue_empty:
            evidence.append(_queue_words(q) + ": starved")
        return {"level": level, "limiting_stage": stage, "evidence": "; ".join(evidence), "advice": advice}
    stage, advice = _trainer_limits(path, result, evidence, baseline_ips, framework)
    if level == LEVELS[3]:
        advice = "run with telemetry on to name the limiting stage"
        stage = "unknown"
    return {"level": level, "limiting_stage": stage, "evidence": "; ".join(evidence), "advice": advice}


def _busy(prod: dict | None) -> bool:
    """Producers blocked in send most of their time: they could give more."""
    return prod is not None and prod.get("send_wait_share") is not None and prod["send_wait_share"] >= SEND_WAIT_BUSY


def _not_this_path(path: str, advice: str) -> str:
    """Advice never tells a run to switch to the path it is already on (nor lists it among the remedies)."""
    name = re.escape(path)
    # "(zmq-consume, producers on other hosts)" -> "(producers on other hosts)"
    advice = re.sub(rf"\(\s*{name}\s*,\s*", "(", advice)
    advice = re.sub(rf",\s*{name}\s*(?=[),])", "", advice)
    advice = re.sub(rf"\(\s*{name}\s*\)\s*", "", advice)
    if f"use {path}" not in advice:
        return advice
    parts = [p for p in advice.replace(", or ", "; ").replace(" or ", "; ").split("; ") if f"use {path}" not in p]
    return " or ".join(parts) if parts else "speed up the producers"


def _producer_advice(maker: dict | None, prod: dict, baseline_ips: float | None, ips: float) -> str:
    """What to do when the producers limit, in terms of who they are: the user's loader, an external one, ours."""
    need = f"{baseline_ips:.0f} img/s" if baseline_ips else "more"
    kind = (maker or {}).get("kind")
    if kind == "external":
        return (
            f"{maker['name']} delivers {rate_figure(ips)} img/s; it would need {need} to keep up: "
            "add workers or producers on that side"
        )
    if kind == "loader":
        workers = max(1, maker.get("workers") or 1)
        per_worker = prod["images_per_sec"] / workers
        needed = math.ceil(baseline_ips / per_worker) if baseline_ips and per_worker > 0 else None
        stage = f"speed up its slowest stage (bench_input.py --loader {maker['loader']} --loader-only names it)"
        cores = os.cpu_count() or 1
        if needed and needed > cores:  # a worker uses at most a core: past the cores, more of them cannot help
            return (
                f"{maker['name']} limits at {per_worker:.0f} img/s per worker (a worker uses at most one core): "
                f"{need} needs about {needed} cores at that rate and this machine has {cores}, so more workers "
                f"cannot help a CPU-bound loader here; {stage}, or run its producers on machines with those cores"
            )
        how = f"about {needed} workers (--producers x --producer-workers; now {workers})" if needed else "more workers"
        return f"{maker['name']} limits at {per_worker:.0f} img/s per worker: run {how}, or {stage}"
    return "add producers (--producers) or workers (--producer-workers), or use DALI"


def _no_better(other: dict, this: dict) -> bool:
    """Whether `other` measured no better than `this` in the same run: capacity intervals when both have
    them (other's low end not above this one's high end), else the ratios to the baseline."""
    a, b = (other.get("capacity") or {}).get("interval"), (this.get("capacity") or {}).get("interval")
    if a and b and a[0] is not None and b[0] is not None:
        return b[1] is None or a[0] <= b[1]
    ra, rb = other.get("ratio_to_baseline"), this.get("ratio_to_baseline")
    if ra is None or rb is None:
        return False
    ua = other.get("uncertainty") or {}
    return ra <= rb or bool(ua.get("within_noise"))


def _without(name: str, advice: str) -> str:
    """The advice without its "use NAME (...)" alternative: "X: use NAME (the op) or Y" -> "X: Y"."""
    n = re.escape(name)
    advice = re.sub(rf"\(\s*{n}\s*,\s*", "(", advice)  # "(zmq-consume, producers on other hosts)"
    use = rf"use {n}(?:\s*\([^)]*\))?"
    if f"use {name}" not in advice:
        return advice
    out = re.sub(rf"{use}(?:,\s*or\s+|\s+or\s+|,\s*)", "", advice, count=1)
    if out == advice:
        out = re.sub(rf"(?:,\s*or\s+|\s+or\s+|,\s*){use}", "", advice, count=1)
    if out == advice:
        out = re.sub(use, "", advice, count=1).strip(" :;,")
    return out or "speed up this path's own stages"


SAME_FIGURE = 0.05  # the producers' own count and the trainer's rate closer than this share are one figure


def _delivered(counted: float, ips: float) -> str:
    """The rate the input delivered, as the results table prints it; the producers' own count beside it only
    where it differs, said as what it is: a count over another span than the trainer's timed windows."""
    if ips > 0 and abs(counted - ips) <= SAME_FIGURE * ips:
        return f"{rate_figure(ips)} img/s"
    if drained(counted, ips):
        return (
            f"{rate_figure(counted)} img/s by their own count, while the timed windows read {rate_figure(ips)}: "
            "the windows drained batches queued before them (not a rate: lengthen --steps)"
        )
    return (
        f"{rate_figure(ips)} img/s to the trainer in its timed windows (the table's figure; {rate_figure(counted)} "
        "img/s by their own count, taken over another span)"
    )


def _input_limits(result: dict, evidence: list[str], baseline_ips: float | None) -> tuple[str, str]:
    """The input limits: the producers' figures say which side of the wire (stage, advice)."""
    prod = (result.get("telemetry") or {}).get("producers")
    words = result.get("input") or _GENERIC
    maker = words.get("batch_maker")
    ips = result["images_per_sec"]["median"]
    against = f" against {baseline_ips:.0f} img/s with on-device data" if baseline_ips else ""
    who = maker["name"] if maker and maker["kind"] in ("loader", "external") else "producers"
    if prod is not None and not _busy(prod):
        evidence.append(
            f"{who} deliver{'s' if who != 'producers' else ''} {_delivered(prod['images_per_sec'], ips)}{against}, "
            f"waiting to send only {100 * (prod['send_wait_share'] or 0):.0f}% of their time"
        )
        return "producer", _producer_advice(maker, prod, baseline_ips, ips)
    if prod is not None:
        evidence.append(
            f"producers wait to send {100 * prod['send_wait_share']:.0f}% of their time "
            f"(send latency {prod['send_latency_ms']:.0f} ms): they could give more"
        )
        return "consumer", words["advice"]
    evidence.append(f"{words['delivers_words']} {rate_figure(ips)} img/s{against}")  # the table's figure
    if maker and maker["kind"] == "external":
        need = f"{baseline_ips:.0f} img/s" if baseline_ips else "more"
        return "input", (
            f"{maker['name']} (or the wire to it) delivers {rate_figure(ips)} img/s and would need {need}: "
            "add workers or producers on that side"
        )
    if maker and maker["kind"] == "loader":
        return "input", _producer_advice(maker, {"images_per_sec": ips}, baseline_ips, ips)
    return "input", words["input_advice"]


def _clearly_below(result: dict, ips: float, baseline_ips: float) -> bool:
    """Below the baseline beyond noise (the ratio's interval under 1.0); without an interval, 20% below."""
    u = result.get("uncertainty") or {}
    if u.get("ratio") and u.get("within_noise") is not None:
        return u["ratio"][1] < 1.0
    return ips < 0.8 * baseline_ips


def _input_cores(result: dict) -> float | None:
    cpu = (result.get("telemetry") or {}).get("cpu")
    try:
        return cpu["input"]["total"]["cores"]
    except (TypeError, KeyError):
        return None


def _emulated_advice(capacity: dict | None) -> str:
    """The advice where the emulated devices set the pace: in a capacity run this result is the capacity's own
    probe, which kept up by definition, and the capacity above says where the input stops keeping up."""
    if not capacity:
        return (
            "the input keeps up with the emulated devices' fixed rate: ask more of it (more devices, a higher "
            "--emulate-rate, or --find-capacity) to see where it stops keeping up"
        )
    ok, short = capacity.get("bracket_per_device") or (None, None)
    found = capacity.get("images_per_sec")
    if ok is None or found is None:
        return "this is a probe of the capacity search: the capacity table above says what the input sustained"
    here = f"this is the capacity's own probe, at {ok:,.0f} img/s per device, where the input keeps up"
    if short is None:
        return f"{here}, as at every demand the search asked: its capacity is at least {found:,.0f} img/s"
    return (
        f"{here}; at {short:,.0f} per device it fell short: its capacity, {found:,.0f} img/s, is where it stops "
        "keeping up"
    )


def _trainer_limits(
    path: str, result: dict, evidence: list[str], baseline_ips: float | None, framework: str | None = None
) -> tuple[str, str]:
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
    faster = FASTER_STEP.get(framework, FASTER_STEP[None])
    advice = f"the input keeps up: a faster model step ({faster}) is what would help"
    if (result.get("emulated") or {}).get("emulated"):  # the step's rate is fixed: fp16 or XLA change nothing
        advice = _emulated_advice(result.get("capacity"))
    if baseline_ips:
        evidence.append(f"{rate_figure(ips)} img/s against {baseline_ips:.0f} img/s with on-device data")
        if _clearly_below(result, ips, baseline_ips):
            gap = 100 * (1 - ips / baseline_ips)
            cores = _input_cores(result)
            words = result.get("input") or _GENERIC
            if path == "cpu":
                # Its images are made by the trainer's own threads: their CPU is counted with the trainer.
                evidence.append(
                    f"steps are {gap:.0f}% slower without waiting for input: this path makes its images in the "
                    "trainer's own threads every step, so making them is part of each step"
                )
                return "trainer", words["input_advice"]
            if cores is not None and cores >= INPUT_CORES_SMALL:
                evidence.append(
                    f"steps are {gap:.0f}% slower without waiting for input while the input used {cores:.1f} "
                    "cores: it competes with the step for the host CPU"
                )
                return "trainer", words["host_cpu_advice"]
            used = "input CPU not measured" if cores is None else f"the input used {cores:.1f} cores"
            evidence.append(
                f"{gap:.0f}% below the baseline beyond noise, yet steps barely wait for input and {used}: "
                "not explained by the input's figures; the difference is in the trainer step itself with this "
                "path (its copy to the device, the step's own host work) or in the machine's load between the "
                "runs (paths run one after another)"
            )
            return "unexplained", (
                "--interleave 3 measures it against the baseline in alternating runs, so a change of load hits both; "
                "--profile shows the step's time"
            )
    return "trainer", advice


def add_verdicts(results: dict[str, dict], framework: str | None = None) -> None:
    """Give every path its verdict, against the baseline of the same invocation.

    `framework` ("tf" or "torch") picks the words for a faster model step; without it, each result's own
    `framework` field, else advice that holds for both.
    """
    for path, r in results.items():
        base = baseline_for(results, path)  # a capacity probe's own baseline, at its demand
        if "uncertainty" not in r:  # add_ratios gives it; a caller that skipped it still gets noise-aware verdicts
            r["uncertainty"] = uncertainty(r, base, is_baseline=path == BASELINE)
        r["verdict"] = verdict(path, r, base["images_per_sec"]["median"] if base else None, framework)
    for path, r in results.items():  # advice to switch to a path this very run measured no better is dropped
        v = r["verdict"]
        for other, o in results.items():
            named = f"use {other}" in v["advice"] or f"({other}," in v["advice"]
            if other not in (path, BASELINE) and named and _no_better(o, r):
                v["advice"] = _without(other, v["advice"])
                v["evidence"] += f"; {other} did not measure better in this run"
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


def verdicts_text(results: dict[str, dict], framework: str | None = None) -> str:
    """Give every path its verdict and attribution; the verdict table, then one line of each per path.

    What both trainers print after their results table.
    """
    add_verdicts(results, framework)
    verdicts = "\n".join(line(path, r["verdict"]) for path, r in results.items())
    gaps = "\n".join(
        f"{path}: {invalid_words(bad)}" if (bad := invalid_reason(r)) else sentence(path, r.get("attribution"))
        for path, r in results.items()
    )
    return f"{table(results)}\n\n{verdicts}\n\n{gaps}"
