"""Check a report against docs/results.schema.json, naming the first field that does not match.

The file holds what every result has; each path's own fields come from its declaration
(`consumers.declared.results_schema`), so the schema checked is the file with them added.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import jsonschema

from consumers.declared import results_schema
from profiler.uncertainty import median_interval

FILE_SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "results.schema.json").read_text())
SCHEMA = results_schema(FILE_SCHEMA)
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def check_report(doc: dict) -> None:
    """AssertionError naming the field (as a JSON path) and the problem, for every mismatch found; then the
    figures' own rules (check_figures)."""
    check_figures(doc)
    errors = sorted(_VALIDATOR.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{e.json_path}: {e.message[:300]}" for e in errors[:10]]
        raise AssertionError("report does not match docs/results.schema.json:\n" + "\n".join(lines))


def check_part(part: dict, name: str) -> None:
    """Check one block of a document against the schema's `$defs/<name>` (a --loader-only document's block), and
    its figures (check_figures)."""
    check_figures(part)
    schema = {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{name}"}
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(part), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{e.json_path}: {e.message[:300]}" for e in errors[:10]]
        raise AssertionError(f"block does not match docs/results.schema.json $defs/{name}:\n" + "\n".join(lines))


# A point of --loader-only or --tune has a rate from at least this many slices (runner/loader_only.py MIN_SLICES).
MIN_SLICES = 3
# An epoch's rate after its first batch needs the batches of a window between batch boundaries.
MIN_AFTER_FIRST = 4


def check_figures(doc, where: str = "$") -> None:
    """Every figure of a result file by the rules each must keep, wherever it sits in the document: a median
    lies inside its interval; an interval comes from measured slices or windows (its ends are among them); a
    rate without the batches it needs is absent (null), never a number. AssertionError naming the place."""
    if isinstance(doc, list):
        for i, x in enumerate(doc):
            check_figures(x, f"{where}[{i}]")
        return
    if not isinstance(doc, dict):
        return
    _check_point(doc, where)
    _check_windows(doc, where)
    for k, v in doc.items():
        check_figures(v, f"{where}.{k}")


def _inside(v: float, lo: float | None, hi: float | None, where: str) -> None:
    assert (lo is None or lo <= v * (1 + 1e-9)) and (hi is None or v <= hi * (1 + 1e-9)), (
        f"{where}: median {v} outside its interval [{lo}, {hi}]"
    )


def _check_point(d: dict, where: str) -> None:
    """A rate with an interval beside it: a loader-only point, a --tune row, a capacity."""
    v, iv = d.get("images_per_sec"), d.get("interval")
    if "slice_rates" in d or "process_rates" in d:
        if v is None:
            assert iv is None and d.get("not_measured"), f"{where}: no rate, yet an interval or no reason"
            return
        assert isinstance(iv, list), f"{where}: a rate of {v} without its interval"
        if "process_rates" not in d:  # one process: its rate is its slices' median, the interval theirs
            sl = d["slice_rates"]
            assert len(sl) >= MIN_SLICES, f"{where}: a rate from {len(sl)} slices"
            assert v == statistics.median(sl), f"{where}: rate {v} is not the median of its slices {sl}"
            assert list(median_interval(sl)[:2]) == iv, f"{where}: interval {iv} not that of its slices {sl}"
    if isinstance(v, (int, float)) and isinstance(iv, list) and len(iv) == 2:
        _inside(v, iv[0], iv[1], where)
    if "images_per_sec_after_first" in d and d["images_per_sec_after_first"] is not None:
        assert d["batches"] >= MIN_AFTER_FIRST, f"{where}: a rate after the first batch from {d['batches']} batches"


def _check_windows(d: dict, where: str) -> None:
    """A trainer's path: its median images/s inside the `uncertainty` interval, whose ends are windows it timed."""
    ips, u = d.get("images_per_sec"), d.get("uncertainty")
    if not (isinstance(ips, dict) and isinstance(u, dict) and u.get("images_per_sec")):
        return
    lo, hi = u["images_per_sec"]
    _inside(ips["median"], lo, hi, where)
    windows = ips.get("repeats") or [ips["median"]]
    assert median_interval(windows)[:2] == (lo, hi), f"{where}: interval [{lo}, {hi}] not from its windows {windows}"
