"""What `--loader-only --tune` reports: each setting tried, the line to paste, or the shortfall and its limit.

The line to paste is a call the user's code can take as it is: a
DataLoader's class over `dataset` with the arguments it was made with
(those that are literals; its sampler, collate_fn, generator and
worker_init_fn are named in a comment as kept) and the chosen settings; for
tf.data or a DataFlow, the loader's callable with its `--loader-arg`s and
the chosen settings as keyword arguments.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from tabulate import tabulate

from core.atomic import atomic_write, write_all
from core.loader_settings import call_arguments
from core.loader_spec import LoaderSpec
from core.loader_stages import UNACCOUNTED, limiting
from profiler.earlier import write_keeping_earlier
from profiler.loader_report import Demand, cores_for, cores_words, demand_words, duplicates_words, stages_text

CORES_BOUND = 0.9  # a setting that used this share of the machine's cores has the cores as its limit


def paste_line(spec: LoaderSpec, info: dict, setting: dict) -> str:
    """The call to paste, with `setting` in it."""
    if info["kind"] == "dataloader":
        args = call_arguments(info["arguments"], setting)
        if not args.get("pin_memory"):
            args.pop("pin_memory", None)  # the default
        words = ", ".join(["dataset", *(f"{k}={v!r}" for k, v in args.items())])
        kept = f"  # and your {', '.join(info['kept'])} as before" if info["kept"] else ""
        return f"{info['class']}({words}){kept}"
    fn = spec.target.rpartition(":")[2]
    args = {**dict(spec.args), **setting}
    return f"{fn}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def best_of(tried: list[dict]) -> tuple[dict | None, list[dict]]:
    """(the best setting, the settings it cannot be told from): a setting is best only where its interval lies
    above every other's; else the settings whose intervals reach the top one's are alike, and the best is the
    cheapest of them (the first tried). (None, []) where no setting measured a rate."""
    measured = [t for t in tried if t["images_per_sec"] is not None]
    if not measured:
        return None, []
    top = max(measured, key=lambda t: t["images_per_sec"])
    low = (top["interval"] or [top["images_per_sec"]] * 2)[0]
    alike = [t for t in measured if t is top or (t["interval"] or [t["images_per_sec"]] * 2)[1] >= low]
    return alike[0], alike


def _limit(best: dict, stages: dict | None, machine_cores: int) -> dict:
    """What limits the best setting: the slowest stage of a sample, and whether it used the machine's cores."""
    slowest = None
    if stages and stages.get("stages"):
        # The largest stage, or what no stage covers where that is larger (the listed stages explain little).
        top = limiting(stages["stages"], stages["shares_sum"], stages["seconds_per_sample"])
        slowest = {"stage": top["name"], "share": top["share"], "seconds_per_sample": top["seconds_per_sample"]}
        share = {s["name"]: s["share"] for s in stages["stages"]}
        # Stages whose time this many samples cannot tell from the slowest's (core/loader_stages.py).
        tied = stages.get("tied_with_slowest", []) if top["name"] != UNACCOUNTED else []
        slowest["tied_with"] = [{"stage": n, "share": share[n]} for n in tied]
    return {
        "slowest_stage": slowest,
        "stages_note": None if slowest else (stages or {}).get("note", "per-stage timing skipped (--no-stages)"),
        "cores_used": best["cpu_cores"],
        "cores_bound": best["cpu_cores"] >= CORES_BOUND * machine_cores,
    }


def _needs(best: dict | None, demand: Demand, machine_cores: int) -> dict:
    """The cores the demand needs, extrapolated from the best setting's images per CPU-second (the one function
    --loader-only's demand line uses too, profiler/loader_report.py `cores_for`)."""
    rate = best["images_per_sec"] if best else None
    return {**cores_for(demand.total, best, rate, machine_cores), "extrapolated_from": best and best["setting"]}


def document(
    spec: LoaderSpec, info: dict, demand: Demand, tried: list[dict], skipped: list[dict], stages: dict | None,
    machine_cores: int,
) -> dict:  # fmt: skip
    """The JSON of a --tune run; its `tune` block is docs/results.schema.json's loader_tune."""
    chosen = next((t for t in tried if t["meets"]), None)
    shortfall = None
    if chosen is None:
        best, alike = best_of(tried)
        ratio = best["images_per_sec"] / demand.total if best else 0.0
        shortfall = {
            "best": best, "ratio": ratio, "limit": _limit(best, stages, machine_cores) if best else None,
            "told_apart": len(alike) <= 1, "cannot_tell_apart": [t["setting"] for t in alike],
            "needs": _needs(best, demand, machine_cores),
        }  # fmt: skip
    return {
        "loader": spec.name,
        "mode": "loader-tune",
        "machine_cores": machine_cores,
        "demand": {**asdict(demand), "total_images_per_sec": demand.total},
        "tune": {
            "kind": info["kind"],
            "class": info["type"],
            "tried": tried,
            "not_tried": skipped,
            "chosen": {**chosen, "line": paste_line(spec, info, chosen["setting"])} if chosen else None,
            "shortfall": shortfall,
        },
        "stages": stages,
    }


def _words(setting: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items() if v is not None)


def _interval(t: dict) -> str:
    lo_hi = t["interval"]
    return f"{lo_hi[0]:.1f}-{lo_hi[1]:.1f}" if lo_hi else "none"


def _rate(t: dict) -> str:
    return t["not_measured"] if t["images_per_sec"] is None or t.get("not_measured") else f"{t['images_per_sec']:.1f}"


def _figures(t: dict) -> str:
    return (
        f"{_rate(t)} images/s (interval {_interval(t)}), {t['cpu_cores']:.2f} CPU cores, {t['rss_mb']:.0f} MB resident"
    )


def text(doc: dict) -> str:
    """The settings tried, what was not tried, then the line to paste or the shortfall and its limit."""
    tu, d = doc["tune"], doc["demand"]
    rows = [
        [_words(t["setting"]), _rate(t), _interval(t), f"{t['cpu_cores']:.2f}",
         f"{t['rss_mb']:.0f}", "yes" if t["meets"] else "no"]
        for t in tu["tried"]
    ]  # fmt: skip
    headers = ["setting", "images/s", "interval", "CPU cores", "memory MB", "meets"]
    out = [
        f"loader {doc['loader']} alone, no trainer, tuned for {demand_words(d)} ({doc['machine_cores']} cores here)",
        tabulate(rows, headers=headers, disable_numparse=True),
    ]
    out.append(
        "interval: of the median rate of the window's slices (each cut at batch boundaries); a setting that meets "
        "the demand is measured in fresh processes: their median, and an interval spanning theirs"
    )
    out += [f"{s['setting']}: not tried: {s['why']}" for s in tu["not_tried"]]
    repeated = {t["duplicates"]["num_workers"]: t["duplicates"] for t in tu["tried"] if t.get("duplicates")}
    out += [duplicates_words(dup, f"num_workers={n}") for n, dup in repeated.items()]
    out.append("")
    if tu["chosen"]:
        c = tu["chosen"]
        out += [f"the smallest setting that meets it: {_words(c['setting'])}: {_figures(c)}", "", f"    {c['line']}"]
        if words := duplicates_words(c.get("duplicates"), "this setting"):
            out += ["", words]
        return "\n".join(out)
    s = tu["shortfall"]
    out.append(_shortfall_words(s, d["total_images_per_sec"]))
    if not s["needs"]["not_measured"]:
        out.append(cores_words(s["needs"], demand_words(d), _words(s["needs"]["extrapolated_from"])))
    if s["limit"]:
        out.append(_limit_words(s["limit"], doc["machine_cores"]))
    if (doc.get("stages") or {}).get("stages"):  # the table; where there is none, the line above says why
        out += ["", stages_text(doc["stages"])]
    return "\n".join(out)


def _shortfall_words(s: dict, demand: float) -> str:
    """No setting meets the demand: the best (or, where the best cannot be told from others, the cheapest of
    those) and how far short it is."""
    head = f"no setting tried meets {demand:.0f} images/s"
    if s["best"] is None:
        return f"{head}: none measured a rate (too few batches in every window: a longer --loader-seconds)"
    if s["ratio"] <= 0:
        return f"{head}: none delivered a batch"
    short = f"{s['ratio']:.3g}x the demand ({1 / s['ratio']:.3g}x short)"
    if s["told_apart"]:
        return f"{head}: the best, {_words(s['best']['setting'])}, gives {_figures(s['best'])}: {short}"
    alike = "; ".join(_words(x) for x in s["cannot_tell_apart"])
    return (
        f"{head}: these settings cannot be told apart (their intervals overlap): {alike}; the cheapest is "
        f"{_words(s['best']['setting'])}: {_figures(s['best'])}: {short}"
    )


def _limit_words(limit: dict, machine_cores: int) -> str:
    """The stage that limits the loader, and whether the machine's cores ran out first."""
    st = limit["slowest_stage"]
    if st and st["stage"] == UNACCOUNTED:
        stage = (
            f"the limit is none of the listed stages: they explain {100 * (1 - st['share']):.1f}% of a sample's "
            f"time; {100 * st['share']:.1f}% ({1e3 * st['seconds_per_sample']:.2f} ms per sample) is {UNACCOUNTED}"
        )
    elif st and st.get("tied_with"):
        each = [f"{t['stage']} ({100 * t['share']:.1f}%)" for t in [st, *st["tied_with"]]]
        stage = (
            f"the limit is one of the stages {', '.join(each[:-1])} and {each[-1]} of a sample's time: a tie "
            "within the noise of the samples timed, so speeding up either one alone may not be enough"
        )
    elif st:
        stage = (
            f"the limit is the stage {st['stage']} ({100 * st['share']:.0f}% of a sample's time, "
            f"{1e3 * st['seconds_per_sample']:.2f} ms per sample)"
        )
    else:
        stage = f"no stage named: {limit['stages_note']}"
    used = f"the best setting used {limit['cores_used']:.2f} of the machine's {machine_cores} cores"
    if limit["cores_bound"]:
        return f"{stage}; {used}: the cores are used up (a cheaper stage, or more cores)"
    return f"{stage}; {used} (not all: other work on the machine, or the loader waiting on something else)"


def write_json(path: str, doc: dict) -> None:
    atomic_write(path, json.dumps(doc, indent=2), what=f"--json {path}")


def write_files(out: str, doc: dict, extra: dict[str, str | bytes] | None = None) -> list[str]:
    """tune.json (and `extra`: the timeline) in `out`, all or none; an earlier set there is kept."""
    os.makedirs(out, exist_ok=True)
    files = {"tune.json": json.dumps(doc, indent=2), **(extra or {})}
    return write_keeping_earlier(
        out,
        list(files),
        lambda: write_all({os.path.join(out, n): data for n, data in files.items()}, what=f"--out {out}"),
    )
