"""Turn per-path results into the comparison table and the JSON report (written atomically)."""

from __future__ import annotations

import json
import os

from tabulate import tabulate

from core.atomic import atomic_write, not_regular
from core.errors import ConfigError
from core.registry import BASELINE

SCHEMA_VERSION = 2  # of every JSON feedbench writes (--json, --out, --sweep); docs/results.schema.json


def add_ratios(results: dict[str, dict]) -> None:
    base = results.get(BASELINE)
    for r in results.values():
        r["ratio_to_baseline"] = r["images_per_sec"]["median"] / base["images_per_sec"]["median"] if base else None


def table(results: dict[str, dict], towers: int, input_only: bool) -> str:
    rows = []
    for path, r in results.items():
        ips = r["images_per_sec"]
        ratio = r.get("ratio_to_baseline")
        row = [
            path,
            f"{ips['median']:.1f}",
            f"{ips['min']:.1f}–{ips['max']:.1f}",
            f"{r['images_per_sec_per_device']['median']:.1f}",
            f"{r['step_time_ms']['p50']:.0f} / {r['step_time_ms']['p90']:.0f}",
            "baseline" if path == BASELINE else (f"{ratio:.2f}" if ratio is not None else "n/a"),
        ]
        if input_only:
            row.append(f"{ips['median'] * r['bytes_per_image'] / 1e6:.0f}")
        rows.append(row)
    headers = ["input path", "images/s", "min–max", f"per device ({towers})", "step ms p50 / p90", "vs gpu"]
    if input_only:
        headers.append("MB/s")
    return tabulate(rows, headers=headers, disable_numparse=True)


def write_json(path: str, doc: dict) -> None:
    """The report, with its schema version, written atomically: no half-written report, ever (OutputError)."""
    atomic_write(path, json.dumps({"schema_version": SCHEMA_VERSION, **doc}, indent=2), what=f"--json {path}")


# What --out writes: the sweep's set (profiler/sweep.py) and, with --find-capacity, the capacity plot.
OUT_FILES = ("results.json", "results.csv", "results.md", "results.png", "capacity.png")


def check_output_places(json_path: str | None, out_dir: str | None) -> None:
    """Refuse, before anything runs, a --json or --out place that could not be written at the end."""
    if json_path:
        folder = os.path.dirname(os.path.abspath(json_path))
        if os.path.isdir(json_path):
            raise ConfigError(f"--json {json_path}: is a folder; give the name of the file to write")
        kind = not_regular(json_path)
        if kind:
            raise ConfigError(f"--json {json_path}: exists and is {kind}, not a regular file; refusing to replace it")
        _writable_folder("--json", json_path, folder)
    if out_dir:
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise ConfigError(f"--out {out_dir}: exists and is not a folder")
        _writable_folder(
            "--out", out_dir, out_dir if os.path.isdir(out_dir) else os.path.dirname(os.path.abspath(out_dir))
        )
        for name in OUT_FILES:
            kind = not_regular(os.path.join(out_dir, name))
            if kind:
                raise ConfigError(
                    f"--out {out_dir}: {name} exists and is {kind}, not a regular file; refusing to replace it"
                )


def _writable_folder(flag: str, given: str, folder: str) -> None:
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {given}: no such folder {folder}; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {given}: cannot write in {folder} (read-only or not permitted)")
