"""`--sweep`: the grid of paths, device counts, batch sizes, precision and XLA, and the files it writes.

The DLPerf way: one grid, each point measured like a single run (same
warm-up, steps and repeats), every point's paths compared with the baseline
measured at the same point. Results go to one folder as results.json,
results.csv, results.md and results.png; every file is written to a
temporary name and renamed, so an interrupted sweep leaves no half file.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import os
from dataclasses import replace

from tabulate import tabulate

from core.atomic import write_all
from core.config import BASELINE, BenchConfig
from profiler.earlier import write_keeping_earlier
from profiler.report import SCHEMA_VERSION

# Flags that take comma-separated lists under --sweep, and their BenchConfig fields.
SWEEP_FLAGS = {
    "--fake-location": "paths",
    "--num-gpus": "num_gpus",
    "--batch": "batch",
    "--use-fp16": "use_fp16",
    "--use-xla-compile": "use_xla_compile",
    "--emulate-rate": "emulate_rate",
}

# The columns of results.csv, and the keys of each row in results.json.
COLUMNS = [
    "path",
    "num_gpus",
    "batch",
    "use_fp16",
    "use_xla_compile",
    "image_size",
    "input_only",
    "model",
    "emulated_images_per_sec_per_device",
    "images_per_sec",
    "images_per_sec_min",
    "images_per_sec_max",
    "images_per_sec_lo",
    "images_per_sec_hi",
    "images_per_sec_per_device",
    "ratio_to_baseline",
    "ratio_lo",
    "ratio_hi",
    "within_noise",
    "windows",
    "interval_confidence",
    "ratio_method",
    "scaling_efficiency",
    "step_time_ms_p50",
    "step_time_ms_p90",
    "step_time_ms_p99",
    "input_wait_share",
    "verdict",
    "limiting_stage",
    "capacity_images_per_sec",
    "capacity_lo",
    "capacity_hi",
    "capacity_devices",
    "capacity_place",
]


class SweepError(ValueError):
    """A sweep list that cannot be run; the message names the flag and the value."""


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise SweepError(f"{text!r} is not true or false")


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SweepError(f"{flag} {text}: not a list of integers") from None
    if not values or min(values) < 1:
        raise SweepError(f"{flag} {text}: every value must be at least 1")
    return values


def split_args(argv: list[str], known_paths: list[str]) -> tuple[dict[str, list] | None, list[str]]:
    """With --sweep: the grid from the list-valued flags, and the other flags for the normal parser.

    `known_paths` are the input path names a --fake-location list may hold.
    Without --sweep, returns (None, argv) untouched.
    """
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("--sweep", action="store_true")
    pre.add_argument("--fake-location")
    pre.add_argument("--num-gpus")
    pre.add_argument("--batch")
    pre.add_argument("--use-fp16", nargs="?", const="true")
    pre.add_argument("--use-xla-compile", nargs="?", const="true")
    pre.add_argument("--emulate-rate")
    try:
        known, rest = pre.parse_known_args(argv)
    except argparse.ArgumentError as e:  # "--batch -2,2": a list that starts with '-' reads as a flag
        if "--sweep" not in argv:
            return None, argv  # the normal parser says what is wrong
        raise SweepError(f"{e} (a list that starts with '-' takes the = form: --batch=-2,2)") from None
    if not known.sweep:
        return None, argv
    grid: dict[str, list] = {}
    if known.fake_location:
        paths = [p.strip() for p in known.fake_location.split(",") if p.strip()]
        bad = [p for p in paths if p not in known_paths]
        if bad:
            raise SweepError(f"--fake-location {bad[0]!r}: choose from {', '.join(known_paths)}")
        grid["paths"] = [BASELINE] + [p for p in dict.fromkeys(paths) if p != BASELINE]
    if known.num_gpus:
        grid["num_gpus"] = _ints("--num-gpus", known.num_gpus)
    if known.batch:
        grid["batch"] = _ints("--batch", known.batch)
    if known.emulate_rate:
        try:
            rates = [float(x) for x in known.emulate_rate.split(",") if x.strip()]
        except ValueError:
            raise SweepError(f"--emulate-rate {known.emulate_rate}: not a list of numbers") from None
        if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
            raise SweepError(f"--emulate-rate {known.emulate_rate}: every rate must be a finite number above 0")
        grid["emulate_rate"] = rates
        rest = [*rest, "--model", "emulated"]
    for flag, value in (("use_fp16", known.use_fp16), ("use_xla_compile", known.use_xla_compile)):
        if value is not None:
            try:
                grid[flag] = list(dict.fromkeys(_bool(x) for x in value.split(",")))
            except SweepError as e:
                raise SweepError(f"--{flag.replace('_', '-')} {value}: {e}") from None
    return grid, rest + ["--sweep"]


def points(base: BenchConfig, grid: dict[str, list]) -> list[BenchConfig]:
    """One config per grid point (paths run inside each point)."""
    keys = ["num_gpus", "batch", "use_fp16", "use_xla_compile", "emulate_rate"]
    lists = [grid.get(k, [getattr(base, k)]) for k in keys]
    paths = grid.get("paths", base.paths)
    return [
        replace(base, paths=list(paths), shrunk={}, **dict(zip(keys, combo))) for combo in itertools.product(*lists)
    ]


def rows_of(runs: list[dict]) -> list[dict]:
    """Flat rows, one per (grid point, path), with scaling efficiency against one device."""
    rows = []
    for run in runs:
        c = run["config"]
        for path, r in run["paths"].items():
            tel = r.get("telemetry") or {}
            v = r.get("verdict") or {}
            u = r.get("uncertainty") or {}
            ips_iv = u.get("images_per_sec") or [r["images_per_sec"]["min"], r["images_per_sec"]["max"]]
            ratio_iv = u.get("ratio") or [None, None]
            rows.append(
                {
                    "path": path,
                    "num_gpus": c["num_gpus"],
                    "batch": c["batch"],
                    "use_fp16": c["use_fp16"],
                    "use_xla_compile": c["use_xla_compile"],
                    "image_size": c["image_size"],
                    "input_only": c["input_only"],
                    "model": _model(c),
                    "emulated_images_per_sec_per_device": (c.get("emulation") or {}).get("images_per_sec"),
                    "images_per_sec": r["images_per_sec"]["median"],
                    "images_per_sec_min": r["images_per_sec"]["min"],
                    "images_per_sec_max": r["images_per_sec"]["max"],
                    # The median's interval and the ratio's (profiler/uncertainty.py).
                    "images_per_sec_lo": ips_iv[0],
                    "images_per_sec_hi": ips_iv[1],
                    "images_per_sec_per_device": r["images_per_sec_per_device"]["median"],
                    "ratio_to_baseline": r.get("ratio_to_baseline"),
                    "ratio_lo": ratio_iv[0],
                    "ratio_hi": ratio_iv[1],
                    "within_noise": u.get("within_noise"),
                    "windows": u.get("windows", len(r["images_per_sec"].get("repeats") or [])),
                    "interval_confidence": u.get("confidence"),
                    "ratio_method": u.get("ratio_method"),
                    "scaling_efficiency": None,
                    "step_time_ms_p50": r["step_time_ms"]["p50"],
                    "step_time_ms_p90": r["step_time_ms"]["p90"],
                    "step_time_ms_p99": r["step_time_ms"]["p99"],
                    "input_wait_share": tel.get("input_wait_share"),
                    "verdict": v.get("level"),
                    "limiting_stage": v.get("limiting_stage"),
                    **_capacity_cells(r.get("capacity")),
                }
            )
    one = {
        (r["path"], r["batch"], r["use_fp16"], r["use_xla_compile"]): r["images_per_sec"]
        for r in rows
        if r["num_gpus"] == 1
    }
    for r in rows:
        base = one.get((r["path"], r["batch"], r["use_fp16"], r["use_xla_compile"]))
        if base:
            r["scaling_efficiency"] = r["images_per_sec"] / (r["num_gpus"] * base)
    return rows


def _model(c: dict) -> str:
    """What a row trained: emulated runs say so in every row (with the rate per device in another column), and
    an --input-only run trained nothing."""
    if c.get("emulation"):
        return f"emulated {c['emulation']['device']}"
    return "none (input only)" if c.get("input_only") else "ResNet-50"


def _capacity_cells(c: dict | None) -> dict:
    """A capacity run's figures for the row: capacity, its interval (hi None: open above), emulated devices."""
    if not c:
        return dict.fromkeys(
            ("capacity_images_per_sec", "capacity_lo", "capacity_hi", "capacity_devices", "capacity_place")
        )
    lo, hi = (c.get("interval") or [None, None])[:2]
    return {
        "capacity_images_per_sec": c.get("images_per_sec"),
        "capacity_lo": lo,
        "capacity_hi": hi,
        "capacity_devices": c.get("devices"),
        "capacity_place": c.get("place"),
    }


def to_csv(rows: list[dict]) -> str:
    """Floats as repr, so a reader gets back exactly the numbers in results.json."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r[k] is None else repr(r[k]) if isinstance(r[k], float) else r[k]) for k in COLUMNS})
    return buf.getvalue()


def _f(x: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "–" if x is None else f"{x * scale:{spec}}{suffix}"


def _capacity_text(r: dict) -> str:
    cap, lo, hi = r.get("capacity_images_per_sec"), r.get("capacity_lo"), r.get("capacity_hi")
    if r["path"] == BASELINE:
        return f"{_f(cap, ',.0f')} (baseline)"
    if cap is None:
        return f"< lowest probe ({_f(hi, ',.0f')})"
    upper = "open" if hi is None else f"{hi:,.0f}"
    return f"{'>= ' if hi is None else ''}{cap:,.0f} ({_f(lo, ',.0f')}–{upper})"


def to_markdown(rows: list[dict]) -> str:
    """The table a person reads first: one line per (grid point, path)."""
    head = [
        "input path", "model", "devices", "batch", "fp16", "XLA", "images/s", "interval", "per device",
        "vs baseline (interval)", "scaling eff.", "input wait", "verdict (limiting stage)",
    ]  # fmt: skip
    cells = []
    for r in rows:
        ratio = "baseline" if r["path"] == BASELINE else _f(r["ratio_to_baseline"], ".2f")
        if r["path"] != BASELINE and r.get("ratio_lo") is not None:
            ratio += f" ({r['ratio_lo']:.2f}–{r['ratio_hi']:.2f})"
            if r.get("within_noise"):
                ratio += " ≈ within noise"
        lo = r.get("images_per_sec_lo", r["images_per_sec_min"])
        hi = r.get("images_per_sec_hi", r["images_per_sec_max"])
        model = r.get("model") or "ResNet-50"
        if r.get("emulated_images_per_sec_per_device"):
            model += f" ({r['emulated_images_per_sec_per_device']:.0f} img/s per device)"
        cells.append(
            [
                f"`{r['path']}`",
                model,
                str(r["num_gpus"]),
                str(r["batch"]),
                "yes" if r["use_fp16"] else "no",
                "yes" if r["use_xla_compile"] else "no",
                _f(r["images_per_sec"], ".1f"),
                f"{lo:.1f}–{hi:.1f}",
                _f(r["images_per_sec_per_device"], ".1f"),
                ratio,
                _f(r["scaling_efficiency"], ".0f", 100, "%"),
                _f(r["input_wait_share"], ".0f", 100, "%"),
                r["verdict"]
                if r["limiting_stage"] == "none"
                else f"{r['verdict'] or '–'} ({r['limiting_stage'] or '–'})",
            ]
        )
    capacity = any(r.get("capacity_devices") is not None for r in rows)
    if capacity:  # a capacity run: its answer beside the first probe's figures
        head += ["capacity img/s (interval)", "emulated devices", "place"]
        for r, row in zip(rows, cells, strict=True):
            place = r.get("capacity_place")
            row += [_capacity_text(r), _f(r.get("capacity_devices"), ".2f"), "–" if place is None else str(place)]
    text = tabulate(cells, headers=head, tablefmt="github", disable_numparse=True) + "\n"
    if capacity:
        text += (
            "\nimages/s: each path's first probe, at the preset's rate. Capacity: the highest demand a probe kept "
            "up with at >= 97% of the baseline, and its interval (docs/emulated.md); rank the paths by it. Place: "
            "paths whose intervals overlap (directly or through another path) share one; this run cannot order them.\n"
        )
    windows = sorted({r["windows"] for r in rows if r.get("windows")})
    if windows:
        n = windows[0] if len(windows) == 1 else f"{windows[0]}–{windows[-1]}"
        conf = min((r["interval_confidence"] for r in rows if r.get("interval_confidence") is not None), default=None)
        text += (
            f"\nIntervals: the median's, by order statistics over {n} timed windows per path"
            + (f" ({100 * conf:.0f}% confidence or more)" if conf else "")
            + "; a ratio whose interval holds 1.0 is the same as the baseline within noise.\n"
        )
    return text


def write_results(
    out_dir: str, doc: dict, path_order: list[str] | None = None, extra: dict[str, bytes] | None = None
) -> list[str]:
    """results.json, results.csv, results.md and results.png (and `extra` files) in `out_dir`: all or none.

    `path_order` (the registry's order) fixes each path's place and colour in the plot.
    A write that fails (a full disk) leaves none of them (OutputError). A set an earlier run left in `out_dir`
    is kept in its `earlier/` folder (profiler/earlier.py), and the list returned says so.
    """
    from profiler.plot import plot_png

    rows = doc["rows"]
    device = doc.get("device") or {}
    shared = None if device.get("gpus") else device.get("cpu_cores")  # towers on CPU share the machine's cores
    files = {
        "results.json": json.dumps({"schema_version": SCHEMA_VERSION, **doc}, indent=2),
        "results.csv": to_csv(rows),
        "results.md": to_markdown(rows),
        "results.png": plot_png(rows, title=doc.get("title", ""), path_order=path_order, shared_cores=shared),
        **(extra or {}),
    }
    return write_keeping_earlier(
        out_dir,
        list(files),
        lambda: write_all({os.path.join(out_dir, name): data for name, data in files.items()}, what=f"--out {out_dir}"),
    )
