"""Turn per-path results into the comparison table and the JSON report (written atomically)."""

from __future__ import annotations

import json
import os

from tabulate import tabulate

from core.atomic import atomic_write, not_regular
from core.errors import ConfigError
from core.registry import BASELINE, Declaration
from profiler.gpu_state import differs, throttled_words
from profiler.summary import drained, rate_figure
from profiler.training import invalid_reason, invalid_words
from profiler.uncertainty import WITHIN_NOISE, apply_ceiling, baseline_for, drift_words, uncertainty

SCHEMA_VERSION = 3  # of every JSON feedbench writes (--json, --out, --sweep); docs/results.schema.json


def add_ratios(results: dict[str, dict], steps_per_window: int | None = None) -> None:
    """Each path's ratio to the baseline, and the `uncertainty` block of its figures (profiler/uncertainty.py).

    `steps_per_window`: the timed steps of a window, for results without `schedule.timed_steps_per_window`
    (it only words the "N windows of S steps would be needed" line).
    """
    for path, r in results.items():
        base = baseline_for(results, path)
        r["ratio_to_baseline"] = r["images_per_sec"]["median"] / base["images_per_sec"]["median"] if base else None
        if isinstance(r.get("interleaved"), dict):  # --interleave: the median of the paired ratios
            r["ratio_to_baseline"] = r["interleaved"]["ratio"]
        r["uncertainty"] = u = uncertainty(r, base, is_baseline=path == BASELINE)
        if u["steps_per_window"] is None:
            u["steps_per_window"] = steps_per_window
    # A path above the ceiling (the baseline) proves the load changed between runs: every ratio carries it.
    apply_ceiling({p: r["uncertainty"] for p, r in results.items()})


def _versus(path: str, r: dict, u: dict, results: dict[str, dict], base_bad: str | None) -> tuple[str, str]:
    """The "vs gpu (interval)" and "reading" cells of a path's row."""
    ratio = r.get("ratio_to_baseline")
    if path == BASELINE:
        vs = "baseline"
    elif ratio is None:
        vs = "n/a"
    elif u["ratio"]:
        vs = f"{ratio:.2f} ({u['ratio'][0]:.2f}–{u['ratio'][1]:.2f})"
    else:
        vs = f"{ratio:.2f}"
    reading = "" if path == BASELINE else (u.get("reading") or "")
    if base_bad and path != BASELINE:
        return "n/a", "no ratio: the baseline is invalid"
    if gpu := gpu_words(path, r, results.get(BASELINE)):  # the GPU's own state beside the ratio
        reading = f"{reading}; {gpu}" if reading else gpu
    return vs, reading


def _ceiling(path: str, r: dict, results: dict[str, dict]) -> str:
    """An --input-only figure: the path's ceiling where its own consumer limits it; a floor (`≥ N`) where its
    producers do (the verdict's limiting stage), since more of them would raise it (the path says how: its
    `floor_words`); no figure where the producers limit and the windows read far more than the producers' own
    count (a backlog drained)."""
    from profiler.verdict import verdict

    figure = rate_figure(r["images_per_sec"]["median"])
    if path == BASELINE or r.get("model") == "emulated":
        return figure
    base = results.get(BASELINE)
    v = r.get("verdict") or verdict(path, r, base["images_per_sec"]["median"] if base else None)
    if v.get("limiting_stage") != "producer":
        return figure
    own = ((r.get("telemetry") or {}).get("producers") or {}).get("images_per_sec")
    if drained(own, r["images_per_sec"]["median"]):
        return f"not a rate: the windows drained a backlog (producers: {rate_figure(own)}); lengthen --steps"
    words = (r.get("input") or {}).get("floor_words") or Declaration.floor_words  # who limits, and how to raise it
    return f"≥ {figure} ({words})"


def gpu_words(path: str, r: dict, base: dict | None) -> str | None:
    """A path's windows at other GPU clocks, power or throttling than the baseline's (profiler/gpu_state.py).

    Where the ratio came from alternated runs (--interleave), their windows are the ones compared."""
    alternated = r.get("interleaved") or {}
    if alternated.get("gpu_state") and alternated.get("baseline_gpu_state"):
        return differs(alternated["gpu_state"], alternated["baseline_gpu_state"])
    mine = r.get("gpu_state")
    if not mine:
        return None
    if path == BASELINE or not base or not base.get("gpu_state"):
        return f"GPU {throttled}" if (throttled := throttled_words(mine)) else None
    return differs(mine, base["gpu_state"])


def table(results: dict[str, dict], towers: int, input_only: bool) -> str:
    """The results table, then a line that says how its intervals were taken.

    "interval" is the median's interval over the path's windows and "vs gpu" the ratio with its interval;
    "reading" says whether that ratio can be told from 1.0 at all.
    """
    rows = []
    methods = {}
    base_bad = invalid_reason(results[BASELINE]) if BASELINE in results else None
    for path, r in results.items():
        ips = r["images_per_sec"]
        u = r.get("uncertainty") or uncertainty(r, results.get(BASELINE), is_baseline=path == BASELINE)
        lo, hi = u["images_per_sec"]
        methods[u["method"]] = True
        if bad := invalid_reason(r):  # a model that does not train gives no figure
            rows.append([path, "no figure", "", "", "", "n/a", invalid_words(bad)] + ([""] if input_only else []))
            continue
        vs, reading = _versus(path, r, u, results, base_bad)
        figure = _ceiling(path, r, results) if input_only else rate_figure(ips["median"])
        if figure.startswith("not a rate"):  # no figure from its windows in any column either
            rows.append([path, figure, "", "", "", "n/a", ""] + ([""] if input_only else []))
            continue
        row = [
            path,
            figure,
            f"{rate_figure(lo)}–{rate_figure(hi)}",
            rate_figure(r["images_per_sec_per_device"]["median"]),
            f"{r['step_time_ms']['p50']:.0f} / {r['step_time_ms']['p90']:.0f}",
            vs,
            reading,
        ]
        if input_only:
            row.append(f"{ips['median'] * r['bytes_per_image'] / 1e6:.0f}")
        rows.append(row)
    headers = [
        "input path", "images/s", "interval", f"per device ({towers})", "step ms p50 / p90", "vs gpu (interval)",
        "reading",
    ]  # fmt: skip
    if input_only:
        headers.append("MB/s")
    text = tabulate(rows, headers=headers, disable_numparse=True)
    pairs = {(r.get("uncertainty") or {}).get("ratio_method") for r in results.values()} - {None}
    foot = f"intervals: {'; '.join(methods)}" + (f"; ratios: {', '.join(sorted(pairs))}" if pairs else "")
    drifted = [u for r in results.values() if (u := r.get("uncertainty") or {}).get("drift")]
    if drifted:
        foot += (
            f"\nthe load changed between the runs: {drift_words(drifted[0])} (by its interval's low end), so "
            f"every ratio's interval is widened by that factor (x{drifted[0]['drift']:.3g})"
        )
    if any((r.get("uncertainty") or {}).get("within_noise") for r in results.values()):
        foot += f"\n{WITHIN_NOISE!r}: the ratio's interval holds 1.0; the run cannot tell that path from the baseline"
    return f"{text}\n{foot}"


def cpu_caveat(results: dict[str, dict], has_gpu: bool, model: str) -> str | None:
    """One line for `make bench` without a GPU: the short ResNet-50 comparison cannot separate the paths here.

    On CPU towers the model's own step takes the cores and dominates the run; with a few short windows on a
    shared machine the ratios are noise. Said only when there is no GPU, the model is ResNet-50 and the
    ratios are within noise (or the run had too few windows to judge), so a clear finding is never hidden.
    """
    if has_gpu or model != "resnet50":
        return None
    others = {p: r for p, r in results.items() if p != BASELINE}
    if not others:
        return None
    # Within noise, or a single window: no interval to judge by.
    noise = [p for p, r in others.items() if (r.get("uncertainty") or {}).get("within_noise") is not False]
    if not noise:
        return None
    windows = max(((r.get("uncertainty") or {}).get("windows") or 0) for r in results.values())
    return (
        f"note: without a GPU, this short ResNet-50 run ({windows} windows per path) is dominated by the model's "
        f"own CPU time; its ratios cannot separate the input paths on this machine ({len(noise)} of {len(others)} "
        "cannot be told from the baseline); the emulated capacity table that follows measures the paths themselves"
    )


def write_json(path: str, doc: dict) -> None:
    """The report, with its schema version, written atomically: no half-written report, ever (OutputError)."""
    atomic_write(path, json.dumps({"schema_version": SCHEMA_VERSION, **doc}, indent=2), what=f"--json {path}")


# What --out writes: the sweep's set (profiler/sweep.py), with --find-capacity the capacity plot, and a run's
# timeline (profiler/timeline.py).
OUT_FILES = (
    "results.json",
    "results.csv",
    "results.md",
    "results.png",
    "capacity.png",
    "timeline.json",
    "timeline.png",
)


def check_output_places(json_path: str | None, out_dir: str | None) -> None:
    """Refuse, before anything runs, a --json or --out place that could not be written at the end."""
    if json_path:
        folder = os.path.dirname(os.path.abspath(json_path))
        if os.path.isdir(json_path):
            raise ConfigError(f"--json {json_path}: is a folder; give the name of the file to write")
        kind = not_regular(json_path)
        if kind:
            raise ConfigError(f"--json {json_path}: exists and is {kind}, not a regular file; refusing to replace it")
        writable_folder("--json", json_path, folder)
    if out_dir:
        if os.path.islink(out_dir) and not os.path.exists(out_dir):
            raise ConfigError(
                f"--out {out_dir}: a symlink to {os.readlink(out_dir)}, which does not exist; create that folder first"
            )
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise ConfigError(f"--out {out_dir}: exists and is not a folder")
        writable_folder(
            "--out", out_dir, out_dir if os.path.isdir(out_dir) else os.path.dirname(os.path.abspath(out_dir))
        )
        for name in OUT_FILES:
            kind = not_regular(os.path.join(out_dir, name))
            if kind:
                raise ConfigError(
                    f"--out {out_dir}: {name} exists and is {kind}, not a regular file; refusing to replace it"
                )


def writable_folder(flag: str, given: str, folder: str) -> None:
    """Refuse `flag given` in one line when `folder`, where it would be written, is missing or read-only."""
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {given}: no such folder {folder}; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {given}: cannot write in {folder} (read-only or not permitted)")
