"""What `--loader-only --epochs N` reports: each epoch's first batch and start-up, its rate, and the dip at its ends.

From the clock readings of runner/loader_epochs.py (CLOCK_MONOTONIC, the same
in every process). The rate per second treats each batch's images as
arriving evenly between the batch before it and itself, so a bin's rate is
exact however batches straddle its edges, and the pause at an epoch's change
(no batch while the old workers stop and new ones start) shows as the slow
bins it is. The steady rate is the median epoch's rate from its first batch
to its last; the dip is how far the slowest 1-second bin from an epoch's
last batch on (the pause, then the next epoch's start) falls below it.
"""

from __future__ import annotations

import json
import math
import os
import statistics

from tabulate import tabulate

from core.atomic import atomic_write, write_all
from profiler.earlier import write_keeping_earlier
from profiler.uncertainty import STEP_BATCHES, shift_interval, window_rate

BIN_S = 1.0  # the width of a rate bin
AROUND = 2  # whole bins shown before an epoch's last batch and after the next epoch's first

NOTES = {
    "tf.data": "tf.data starts its threads with its iterator: their start-up is part of the first batch "
    "(start call: making the iterator)",
    "dataflow": "a DataFlow starts its processes in reset_state(), once, before the first epoch (epoch 1's start "
    "call); they serve every epoch",
    "dataset": "feedbench batches the dataset's samples in its own process: no worker processes to start",
    "iterable": "the loader runs in the loop's own process: no worker processes to tell apart",
    "dataloader-0": "num_workers=0: the batches are made in the loop's own process; no workers to start or persist",
}


def epoch_rows(passes: list[dict], workers: list[dict]) -> list[dict]:
    """Per epoch: first batch, the start call, the workers it started and their start-up, its rates."""
    rows = []
    for k, p in enumerate(passes):
        nxt = passes[k + 1]["start"] if k + 1 < len(passes) else math.inf
        mine = [w for w in workers if p["start"] <= w["began"] < nxt]
        t, n = p["times"], p["images"]
        images, seconds = sum(n), t[-1] - p["start"]
        rows.append(
            {
                "epoch": k + 1,
                "batches": len(t),
                "images": images,
                "first_batch_s": t[0] - p["start"],
                "start_call_s": p["began"] - p["start"],
                "workers_started": len(mine),
                "worker_startup_s": max(w["ready"] for w in mine) - p["start"] if mine else None,
                "worker_init_s": max(w["ready"] - w["began"] for w in mine) if mine else None,
                "seconds": seconds,
                "images_per_sec": window_rate(images, seconds, len(t), need=STEP_BATCHES),
                "images_per_sec_after_first": window_rate(images - n[0], t[-1] - t[0], len(t) - 1),
                "wind_down_s": p["end"] - t[-1],
            }
        )
    return rows


def _segments(passes: list[dict]) -> list[tuple[float, float, int]]:
    """(from, to, images) per batch: its images spread over the time since the batch before it."""
    out, prev = [], passes[0]["start"]
    for p in passes:
        for t, n in zip(p["times"], p["images"], strict=True):
            out.append((prev, t, n))
            prev = t
    return out


def rate_in(segments: list[tuple[float, float, int]], lo: float, hi: float) -> float | None:
    """Images per second delivered between `lo` and `hi`, or None where no batch's time falls in it.

    Each batch's images are spread over its own time since the batch before, so one batch covering the whole
    bin gives its own rate, never a burst over a time near zero: the bin needs one batch, as a window that
    holds whole batches' time does (profiler/uncertainty.py `window_rate`, STEP_BATCHES).
    """
    got, batches = 0.0, 0
    for a, b, n in segments:
        overlap = min(b, hi) - max(a, lo)
        if overlap > 0 and b > a:
            got += n * overlap / (b - a)
            batches += 1
    return window_rate(got, hi - lo, batches, need=STEP_BATCHES)


def boundaries(passes: list[dict], steady: float | None) -> list[dict]:
    """Per change of epoch: the pause without a batch, the rate per second around it, the slowest bin."""
    segs = _segments(passes)
    lo, hi = passes[0]["start"], passes[-1]["times"][-1]
    out = []
    for k in range(len(passes) - 1):
        last, first = passes[k]["times"][-1], passes[k + 1]["times"][0]
        steps = range(-AROUND, math.ceil((first - last) / BIN_S) + AROUND)
        bins = [
            {"at_s": j * BIN_S, "images_per_sec": rate_in(segs, last + j * BIN_S, last + (j + 1) * BIN_S)}
            for j in steps
            if lo <= last + j * BIN_S and last + (j + 1) * BIN_S <= hi
        ]
        # From the last batch on (the pause and the restart), the bins that measured a rate.
        after = [b for b in bins if b["at_s"] >= 0 and b["images_per_sec"] is not None]
        slow = min(after, key=lambda b: b["images_per_sec"]) if after else None
        out.append(
            {
                "after_epoch": k + 1,
                "gap_s": first - last,
                "rates_per_sec": bins,
                "slowest_images_per_sec": slow["images_per_sec"] if slow else None,
                "slowest_at_s": slow["at_s"] if slow else None,
                "dip": 1 - slow["images_per_sec"] / steady if slow and steady else None,
            }
        )
    return out


def run_figures(run: dict) -> dict:
    """One run's figures: how its DataLoader was set, each epoch, the steady rate and each change of epoch."""
    rows = epoch_rows(run["passes"], run["workers"])
    after = [r["images_per_sec_after_first"] for r in rows if r["images_per_sec_after_first"]]
    steady = statistics.median(after) if after else None
    info = run["loader"]
    return {
        "persistent_workers": info["persistent_workers"],
        "as_given": info["as_given"],
        "epochs": rows,
        "steady_images_per_sec": steady,
        "boundaries": boundaries(run["passes"], steady),
    }


def saving(runs: list[dict]) -> dict | None:
    """What persistent workers save at each later epoch's start, with its interval, or None without both runs.

    The first batches of epochs 2..N, each way: `saves_s` is the median of every difference without - with
    (the Hodges–Lehmann shift), its interval Moses' (profiler/uncertainty.py), both from the same epochs.
    One later epoch each way has no spread to judge by: no interval, and no saving is told.
    """
    by = {r["persistent_workers"]: r for r in runs if r["persistent_workers"] is not None}
    if set(by) != {False, True} or len(by[False]["epochs"]) < 2:
        return None
    later = {k: [e["first_batch_s"] for e in r["epochs"][1:]] for k, r in by.items()}
    lo, hi, confidence = shift_interval(later[False], later[True])
    measured = confidence > 0
    return {
        "epochs_compared": [e["epoch"] for e in by[False]["epochs"][1:]],
        "first_batch_without_s": statistics.median(later[False]),
        "first_batch_with_s": statistics.median(later[True]),
        "saves_s": statistics.median(a - b for a in later[False] for b in later[True]),
        "interval_s": [lo, hi] if measured else None,
        "confidence": confidence,
        "told_apart": measured and (lo > 0 or hi < 0),
    }


def saving_words(s: dict) -> str:
    """The saving with its interval, or that these epochs cannot tell it from their own noise."""
    epochs = _epochs_words(s["epochs_compared"])
    each = (
        f"the first batch of {epochs} comes {s['first_batch_with_s']:.2f} s after the epoch starts instead of "
        f"{s['first_batch_without_s']:.2f} s (medians)"
    )
    if s["interval_s"] is None:
        return (
            f"persistent_workers=True: cannot be told from one later epoch each way ({each}; one pair of epochs "
            "has no spread to judge the noise by): --epochs 4 or more gives an interval"
        )
    lo, hi = s["interval_s"]
    interval = f"interval {lo:.2f} to {hi:.2f} s, {100 * s['confidence']:.0f}% confidence"
    if not s["told_apart"]:
        return (
            f"persistent_workers=True: no saving told apart from the noise: {each}; the difference, "
            f"{s['saves_s']:.2f} s ({interval}), could be either way"
        )
    verb = "saves" if s["saves_s"] > 0 else "costs"
    return f"persistent_workers=True {verb} {abs(s['saves_s']):.2f} s ({interval}) at each later epoch's start: {each}"


def document(name: str, epochs: int, runs: list[dict], machine_cores: int) -> dict:
    """The JSON of a --loader-only --epochs run; its `epochs` block is docs/results.schema.json's loader_epochs."""
    info = runs[0]["loader"]
    kind = info["kind"] if info["kind"] != "dataloader" or info["num_workers"] else "dataloader-0"
    figures = [run_figures(r) for r in runs]
    return {
        "loader": name,
        "mode": "loader-epochs",
        "machine_cores": machine_cores,
        "epochs": {
            "epochs": epochs,
            "kind": info["kind"],
            "num_workers": info["num_workers"],
            "bin_s": BIN_S,
            "runs": figures,
            "persistent_workers_saving": saving(figures),
            "note": NOTES.get(kind),
        },
    }


def _epochs_words(numbers: list[int]) -> str:
    return f"epoch {numbers[0]}" if len(numbers) == 1 else f"epochs {numbers[0]}-{numbers[-1]}"


def _rate(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.0f}"


def _s(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def run_text(run: dict) -> str:
    """One run's epoch table, steady rate and the rate per second across each change of epoch."""
    rows = [
        [e["epoch"], _s(e["first_batch_s"]), _s(e["start_call_s"]), e["workers_started"], _s(e["worker_startup_s"]),
         _s(e["worker_init_s"]), e["batches"], f"{e['images_per_sec']:.1f}" if e["images_per_sec"] else "",
         f"{e['images_per_sec_after_first']:.1f}" if e["images_per_sec_after_first"] else "",
         _s(e["wind_down_s"])]
        for e in run["epochs"]
    ]  # fmt: skip
    headers = ["epoch", "first batch s", "start call s", "workers started", "worker start-up s", "worker_init s",
               "batches", "images/s", "images/s after 1st", "wind-down s"]  # fmt: skip
    out = [tabulate(rows, headers=headers, disable_numparse=True)]
    steady = run["steady_images_per_sec"]
    if steady:
        out.append(f"steady rate (the median epoch, first batch to last): {steady:.1f} images/s")
    for b in run["boundaries"]:
        k = b["after_epoch"]
        bins = ", ".join(f"{b_['at_s']:+.0f} s {_rate(b_['images_per_sec'])}" for b_ in b["rates_per_sec"])
        line = f"epoch {k} -> {k + 1}: no batch for {b['gap_s']:.2f} s"
        if bins:
            line += f"; images/s per second from epoch {k}'s last batch: {bins}"
        if b["dip"] is not None:
            line += f"; slowest {b['slowest_images_per_sec']:.0f} images/s, {100 * b['dip']:.0f}% below steady"
        out.append(line)
    return "\n".join(out)


def text(doc: dict) -> str:
    """Every run's table, then what persistent workers save, and the note on what cannot be told apart."""
    ep = doc["epochs"]
    workers = f", {ep['num_workers']} worker(s)" if ep["num_workers"] is not None else ""
    out = [f"loader {doc['loader']}: {ep['epochs']} epoch(s) in one process, no trainer ({ep['kind']}{workers})"]
    for run in ep["runs"]:
        if run["persistent_workers"] is not None:
            how = "as the loader sets it" if run["as_given"] else "set here"
            out += ["", f"persistent_workers={run['persistent_workers']} ({how}):"]
        out += ["", run_text(run)] if run["persistent_workers"] is None else [run_text(run)]
    s = ep["persistent_workers_saving"]
    if s:
        out += ["", saving_words(s)]
    if ep["note"]:
        out += ["", f"note: {ep['note']}"]
    return "\n".join(out)


def write_json(path: str, doc: dict) -> None:
    atomic_write(path, json.dumps(doc, indent=2), what=f"--json {path}")


def write_files(out: str, doc: dict, extra: dict[str, str | bytes] | None = None) -> list[str]:
    """loader-epochs.json (and `extra`: the timeline) in `out`, all or none; an earlier set there is kept
    (profiler/earlier.py)."""
    os.makedirs(out, exist_ok=True)
    files = {"loader-epochs.json": json.dumps(doc, indent=2), **(extra or {})}
    return write_keeping_earlier(
        out,
        list(files),
        lambda: write_all({os.path.join(out, n): data for n, data in files.items()}, what=f"--out {out}"),
    )
