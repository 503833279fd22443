"""Split each path's gap to the baseline into waiting for input and slower steps, with the CPU it cost.

Framework-neutral. From step times: a path runs at ratio r of the baseline,
so its steps last T = T0 / r and the gap is 1 - r = (T - T0) / T. Telemetry
measures w, the share of a step spent only waiting for input (nothing else
running). Of the gap, w is waiting (capped at the gap) and the rest, where
steps took longer without waiting, is slower steps: the host work the input
stages do competes with the step. The two parts add up to the gap by
construction. The CPU the input used (profiler/cpu.py) says how much host
work that was: producers (processes, with their workers) and the receive side
inside the trainer (its threads, by name).
"""

from __future__ import annotations

from profiler.training import invalid_reason
from profiler.uncertainty import WITHIN_NOISE, baseline_for, too_short_words

BASELINE = "gpu"
# Below this many cores, the input's host work cannot be what made the steps slower.
INPUT_CORES_SMALL = 0.1


def too_short(result: dict, u: dict) -> str | None:
    """How much longer a run would tell the path from the baseline (profiler/uncertainty.py too_short_words); with
    --interleave N, whose ratio's interval is that of the N paired runs, in pairs of runs (--repeats adds none)."""
    pairs = (result.get("interleaved") or {}).get("pairs")
    if not pairs:
        return too_short_words(u)
    need = u.get("windows_needed") if u.get("within_noise") else None
    if not need:
        return None
    return (
        f"run too short to tell: about {need} pairs of alternating runs would be needed (--interleave {need}; "
        f"this run had {pairs})"
    )


def attribute(result: dict, baseline: dict | None) -> dict | None:
    """The attribution block of one path's result; None without a baseline to compare with."""
    if baseline is None:
        return None
    base_ips = baseline["images_per_sec"]["median"]
    ips = result["images_per_sec"]["median"]
    if base_ips <= 0:
        return None
    # The gap split here is the table's ratio (profiler/report.py add_ratios: with --interleave, the paired
    # runs' median ratio, not this path's run against the baseline's run measured apart from it).
    ratio = result.get("ratio_to_baseline") or ips / base_ips
    gap = max(0.0, 1.0 - ratio)
    tel = result.get("telemetry") or {}
    share = tel.get("input_wait_share")
    waiting = min(gap, share) if share is not None else None
    slower = gap - waiting if waiting is not None else None
    u = result.get("uncertainty") or {}
    out = {
        "ratio": ratio,
        "gap": gap,
        "waiting": waiting,
        "slower_steps": slower,
        "input_wait_share": share,
        # The ratio's interval (profiler/uncertainty.py): a gap within noise is not split into causes.
        "ratio_interval": u.get("ratio"),
        "within_noise": u.get("within_noise"),
        "too_short": too_short(result, u),
    }
    cpu = tel.get("cpu")
    if cpu:
        stages = {"producers": cpu["input"]["producers"]}
        for name, fig in cpu["threads"].items():
            if name != "trainer":
                stages[name] = fig
        for row in cpu["producers"]:
            stages[f"producer {row['producer']}"] = row
        out["cpu"] = {
            "input_cores": cpu["input"]["total"]["cores"],
            "producer_cores": cpu["input"]["producers"]["cores"],
            "receive_cores": cpu["input"]["receive"]["cores"],
            "trainer_cores": cpu["threads"].get("trainer", {}).get("cores", 0.0),
            "cpu_s_per_step": {k: v["cpu_s_per_step"] for k, v in stages.items()},
        }
        maker = (result.get("input") or {}).get("batch_maker") or {}
        if maker.get("kind") == "external":  # another process, maybe another host: not ours to measure
            out["cpu"]["producer_cores"] = None
            out["cpu"]["producers_not_measured"] = f"{maker['name']} is not started by the run"
    return out


def add_attribution(results: dict[str, dict]) -> None:
    """Give every path its attribution against the baseline of the same invocation."""
    for path, r in results.items():
        base = baseline_for(results, path)
        # No gap to split where either side's model did not train (profiler/training.py): neither is a figure.
        untrained = invalid_reason(r) or (base is not None and invalid_reason(base))
        r["attribution"] = None if untrained else attribute(r, base)


def sentence(path: str, a: dict | None) -> str:
    """`zmq-consume: 13% below the baseline — 3% waiting for input, 10% slower steps while the input
    used 0.9 cores (producers 0.6, receive 0.3)`."""
    if a is None:
        return f"{path}: no baseline to compare with"
    cpu = a.get("cpu")
    if path == BASELINE:
        words = f"{path}: the baseline"
    elif a.get("within_noise"):
        lo, hi = a["ratio_interval"]
        words = f"{path}: {WITHIN_NOISE} — {a['ratio']:.2f} of it, interval {lo:.2f}–{hi:.2f}"
        if a.get("too_short"):
            words += f"; {a['too_short']}"
    elif a["gap"] <= 0 and a.get("within_noise") is False and a["ratio"] > 1:
        words = (
            f"{path}: {100 * (a['ratio'] - 1):.0f}% above the baseline beyond noise — the baseline should be the "
            "ceiling, so the machine's load differed between the runs (paths run one after another)"
        )
    elif a["gap"] <= 0:
        words = f"{path}: at the baseline ({100 * (a['ratio'] - 1):+.0f}%)"
    else:
        words = f"{path}: {100 * a['gap']:.0f}% below the baseline"
        if a["waiting"] is not None:
            words += f" — {100 * a['waiting']:.0f}% waiting for input, {100 * a['slower_steps']:.0f}% slower steps"
        else:
            words += " — input wait not measured"
    explained = path == BASELINE or a.get("within_noise") or a["gap"] <= 0
    if cpu:
        slower = a.get("slower_steps") or 0.0
        small = cpu["input_cores"] < INPUT_CORES_SMALL
        joiner = " while the input used" if not explained else "; the input used"
        if not explained and small and slower > 0 and path != "cpu":
            joiner = "; not explained by the input's CPU: it used"
        producers = (
            "producers not measured: external"
            if cpu["producer_cores"] is None
            else f"producers {cpu['producer_cores']:.1f}"
        )
        words += f"{joiner} {cpu['input_cores']:.1f} cores ({producers}, receive {cpu['receive_cores']:.1f})"
    if path == "cpu":
        words += "; the cpu path makes its images in the trainer's own threads, counted with the trainer"
    return words
