"""Turn per-path results into the comparison table and the JSON report (written atomically)."""

from __future__ import annotations

import json
import os
import tempfile

from tabulate import tabulate

from core.config import BASELINE

SCHEMA_VERSION = 1


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
    """Write to a temporary file beside `path`, then rename: no half-written report, ever."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".feedbench-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"schema_version": SCHEMA_VERSION, **doc}, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
