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

BASELINE = "gpu"


def attribute(result: dict, baseline: dict | None) -> dict | None:
    """The attribution block of one path's result; None without a baseline to compare with."""
    if baseline is None:
        return None
    base_ips = baseline["images_per_sec"]["median"]
    ips = result["images_per_sec"]["median"]
    if base_ips <= 0:
        return None
    ratio = ips / base_ips
    gap = max(0.0, 1.0 - ratio)
    tel = result.get("telemetry") or {}
    share = tel.get("input_wait_share")
    waiting = min(gap, share) if share is not None else None
    slower = gap - waiting if waiting is not None else None
    out = {
        "ratio": ratio,
        "gap": gap,
        "waiting": waiting,
        "slower_steps": slower,
        "input_wait_share": share,
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
        feeder = (result.get("input") or {}).get("feeder") or {}
        if feeder.get("kind") == "external":  # another process, maybe another host: not ours to measure
            out["cpu"]["producer_cores"] = None
            out["cpu"]["producers_not_measured"] = f"{feeder['name']} is not started by the run"
    return out


def add_attribution(results: dict[str, dict]) -> None:
    """Give every path its attribution against the baseline of the same invocation."""
    base = results.get(BASELINE)
    for r in results.values():
        r["attribution"] = attribute(r, base)


def sentence(path: str, a: dict | None) -> str:
    """`zmq-consume: 13% below the baseline — 3% waiting for input, 10% slower steps while the input
    used 0.9 cores (producers 0.6, receive 0.3)`."""
    if a is None:
        return f"{path}: no baseline to compare with"
    if path == BASELINE:
        words = f"{path}: the baseline"
    elif a["gap"] <= 0:
        words = f"{path}: at the baseline ({100 * (a['ratio'] - 1):+.0f}%)"
    else:
        words = f"{path}: {100 * a['gap']:.0f}% below the baseline"
        if a["waiting"] is not None:
            words += f" — {100 * a['waiting']:.0f}% waiting for input, {100 * a['slower_steps']:.0f}% slower steps"
        else:
            words += " — input wait not measured"
    cpu = a.get("cpu")
    if cpu:
        joiner = " while the input used" if path != BASELINE and a["gap"] > 0 else "; the input used"
        producers = (
            "producers not measured: external"
            if cpu["producer_cores"] is None
            else f"producers {cpu['producer_cores']:.1f}"
        )
        words += f"{joiner} {cpu['input_cores']:.1f} cores ({producers}, receive {cpu['receive_cores']:.1f})"
    if path == "cpu":
        words += "; the cpu path makes its images in TensorFlow's own threads, counted with the trainer"
    return words
