"""One result for a cluster run from every worker's own: total and per-worker images/s, and the straggler.

Workers train in lock-step (every step ends at a barrier on the parameter
servers), so they all run at the pace of the slowest one and their images/s
come out nearly equal. The straggler is therefore named from where the time
goes: every worker measures how long its steps wait at the barrier, and the
one the others wait for waits least. Its own input wait says why (its
producers are slow) or not (its step itself is slower).
"""

from __future__ import annotations

from tabulate import tabulate

from profiler.training import merge_ranks

# Input wait share from which a worker is said to hold the others back, and how far above the others it must be.
WAIT_SHARE = 0.10
WAIT_MARGIN = 0.05
# Rate spread (slowest vs fastest) from which the slowest worker is named, without barrier figures.
RATE_SPREAD = 0.05
# How much longer (share of a step) the others must wait at the barrier than the straggler.
BARRIER_GAP = 0.10


def _wait_share(worker: dict) -> float | None:
    return (worker.get("telemetry") or {}).get("input_wait_share")


def straggler(workers: list[dict], noun: str = "worker", meeting: str = "the step barrier") -> dict:
    """{"worker": index or None, "why": one line} for the report.

    The same rule for a TensorFlow cluster's workers and PyTorch's ranks
    (`noun` "rank", `meeting` "every gradient all-reduce"): each entry has
    `cluster.task_index`, `cluster.barrier_wait_ms` (None where not measured),
    `images_per_sec`, `step_time_ms` and `telemetry.input_wait_share`.
    """
    if len(workers) < 2:
        return {"worker": None, "why": f"one {noun}: nothing to compare"}
    at_barrier = [(w["cluster"].get("barrier_wait_ms"), w["cluster"]["task_index"], w) for w in workers]
    if all(ms is not None for ms, _, _ in at_barrier):
        (least, who, w), (second, _, _) = sorted(at_barrier, key=lambda x: x[0])[:2]
        step = w["step_time_ms"]["p50"]
        gap = second - least
        if step > 0 and gap >= BARRIER_GAP * step:
            share = _wait_share(w)
            cause = (
                f"its steps wait for its input {100 * share:.0f}% of the time"
                if share is not None and share >= WAIT_SHARE
                else "its own step is the slowest, not its input"
            )
            return {
                "worker": who,
                "why": f"the other {noun}s wait {gap:.0f} ms more per step at {meeting} than it does; {cause}",
            }
        return {"worker": None, "why": f"none: the {noun}s reach {meeting} within {gap:.0f} ms of each other"}
    waits = [(_wait_share(w), w["cluster"]["task_index"]) for w in workers]
    known = sorted(((s, i) for s, i in waits if s is not None), reverse=True)
    if len(known) >= 2:
        (top, who), (second, _) = known[0], known[1]
        if top >= WAIT_SHARE and top - second >= WAIT_MARGIN:
            return {
                "worker": who,
                "why": f"its steps wait for input {100 * top:.0f}% of the time (next {noun}: {100 * second:.0f}%); "
                f"the others wait for it at {meeting}",
            }
    rates = sorted((w["images_per_sec"]["median"], w["cluster"]["task_index"]) for w in workers)
    (slow, who), (fast, _) = rates[0], rates[-1]
    spread = 1 - slow / fast if fast > 0 else 0.0
    if spread >= RATE_SPREAD:
        return {"worker": who, "why": f"lowest images/s, {100 * spread:.0f}% below the fastest {noun}"}
    return {
        "worker": None,
        "why": f"none: the {noun}s' rates are within {100 * spread:.0f}% and none waits for input",
    }


def rank_straggler(ranks: list[dict]) -> dict:
    """PyTorch's ranks under the cluster's rule: {"rank", "host", "why"} (rank None: nobody holds the others)."""
    as_workers = [
        {
            "cluster": {"task_index": r["rank"], "barrier_wait_ms": None},
            "images_per_sec": r["images_per_sec"],
            "step_time_ms": r["step_time_ms"],
            "telemetry": {"input_wait_share": r["input_wait_share"]},
        }
        for r in ranks
    ]
    s = straggler(as_workers, noun="rank", meeting="every gradient all-reduce")
    host = next((r["host"] for r in ranks if r["rank"] == s["worker"]), None)
    return {"rank": s["worker"], "host": host, "why": s["why"]}


def rank_lines(results: dict[str, dict]) -> list[str]:
    """Where a run has several ranks: per rank images/s and input wait, and the straggler of each path."""
    if not any(len(r.get("ranks") or []) > 1 for r in results.values()):
        return []
    rows = []
    for path, r in results.items():
        for p in r.get("ranks") or []:
            share = p["input_wait_share"]
            rows.append(
                [
                    path,
                    p["rank"],
                    p["host"],
                    p["device"],
                    f"{p['images_per_sec']['median']:.1f}",
                    "n/a" if share is None else f"{100 * share:.0f}%",
                    f"{p['input_wait_ms_mean']:.1f}" if p["input_wait_ms_mean"] is not None else "n/a",
                ]
            )
    headers = ["input path", "rank", "host", "device", "images/s", "input wait", "wait ms/step"]
    lines = ["", tabulate(rows, headers=headers, disable_numparse=True)]
    for path, r in results.items():
        s = r.get("straggler")
        if s and s.get("rank") is not None:
            lines.append(f"{path}: rank {s['rank']} ({s['host']}) straggles: {s['why']}")
    return lines


def variables_in_sync(workers: list[dict], mode: str) -> bool:
    """Every worker read the same variables after the last step, and (replicated) its own copies equal them."""
    figures = [w["cluster"]["variables"] for w in workers]
    if len({f["ps"] for f in figures}) != 1:
        return False
    return mode != "distributed_replicated" or all(f.get("local") == f["ps"] for f in figures)


def combine(workers: list[dict], towers_per_worker: int, mode: str) -> dict:
    """The cluster's result dict (same schema as a single run's) with `workers` and `straggler` added.

    Total images/s is the sum of the workers' medians: they step together, so
    their measured windows cover the same stretch of time.
    """
    chief = workers[0]

    def total(key: str) -> float:
        return sum(w["images_per_sec"][key] for w in workers)

    devices = towers_per_worker * len(workers)
    ips = {"median": total("median"), "min": total("min"), "max": total("max")}
    ips["repeats"] = chief["images_per_sec"].get("repeats")
    return {
        "images_per_sec": ips,
        "images_per_sec_per_device": {k: (v / devices if k != "repeats" else v) for k, v in ips.items()},
        "step_time_ms": {q: max(w["step_time_ms"][q] for w in workers) for q in ("p50", "p90", "p99")},
        "final_loss": chief["final_loss"],
        "loss_finite": all(w["loss_finite"] for w in workers),
        **(
            {"training": merge_ranks([w["training"] for w in workers])} if all("training" in w for w in workers) else {}
        ),
        "steps_run": min(w["steps_run"] for w in workers),
        "variables_in_sync": variables_in_sync(workers, mode),
        "straggler": straggler(workers),
        "workers": workers,
    }


def table(result: dict) -> str:
    """Per-worker rows and the total, for the terminal and docs."""
    rows = []
    for w in result["workers"]:
        c = w["cluster"]
        ips = w["images_per_sec"]
        share = _wait_share(w)
        rows.append(
            [
                f"worker {c['task_index']}{' (chief)' if c['task_index'] == 0 else ''}",
                c["host"],
                f"{ips['median']:.1f}",
                f"{ips['min']:.1f}–{ips['max']:.1f}",
                f"{w['step_time_ms']['p50']:.0f} / {w['step_time_ms']['p90']:.0f}",
                "n/a" if c.get("barrier_wait_ms") is None else f"{c['barrier_wait_ms']:.0f}",
                "n/a" if share is None else f"{100 * share:.0f}%",
                f"{w['final_loss']:.4g}",
            ]
        )
    ips = result["images_per_sec"]
    rows.append(["total", "", f"{ips['median']:.1f}", f"{ips['min']:.1f}–{ips['max']:.1f}", "", "", "", ""])
    headers = ["task", "host", "images/s", "min–max", "step ms p50 / p90", "barrier ms", "input wait", "final loss"]
    return tabulate(rows, headers=headers, disable_numparse=True)


def summary_lines(result: dict) -> list[str]:
    """The straggler and the variables check, one line each."""
    s = result["straggler"]
    who = f"worker {s['worker']}: {s['why']}" if s["worker"] is not None else s["why"]
    sync = "in sync on every worker" if result["variables_in_sync"] else "NOT in sync across workers"
    return [f"straggler: {who}", f"variables after the last step: {sync}"]
