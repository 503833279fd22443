"""`bench_input.py --loader M:F --loader-only --tune`: the smallest setting of the user's loader that meets a demand.

A fresh process makes the loader once and says what it is (core/loader_settings.py
`describe`). The grid follows from that: for a torch DataLoader its
`num_workers` (0, 1, 2, 4, ... up to the machine's cores, or
`--loader-workers`), and at each count `prefetch_factor` 2 then 4 and
`persistent_workers` False then True, with `pin_memory` on where a GPU is
here; for `tf.data` the `num_parallel_calls`, `prefetch` and
`private_threadpool_size` its callable takes; for a DataFlow its `num_proc`.
Each setting is one point of the `--loader-only` sweep's measurement
(runner/loader_only.py `measure`, one copy of the loader), cheapest first;
the walk stops at the first that meets the demand, measured in three fresh
processes (their median, and an interval that spans them). Where none does, the
per-stage timing names the stage that limits it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from core import loader_settings
from core.errors import ConfigError
from core.gpus import nvidia_gpus
from core.loader_duplicates import duplicates
from core.loader_spec import LoaderError, LoaderSpec, kind_of
from profiler.loader_report import Demand
from profiler.timeline import Timeline
from profiler.timeline import out_files as timeline_files
from runner.loader_only import (
    LOADER_STAGE,
    Options,
    demand_of,
    in_fresh_process,
    measure,
    print_and_write,
    private_tmpdir,
    rate_words,
    samples_per_epoch,
    stage_timing,
    worker_counts,
)

NO_GPU = "no NVIDIA GPU here: pinned memory only speeds a batch's copy to a GPU (pin_memory=False throughout)"
ON_GPU = "a GPU is here: every setting pins its batches (pin_memory=True), as a GPU training loop runs it"


def _describe(opts: Options) -> dict:
    """Make the loader once, as the user made it (nothing wrapped), and say what it is."""
    obj = opts.spec.build(opts.seed, 0, 1, {}, timeout=opts.timeout)
    return loader_settings.describe(obj, kind_of(obj), opts.spec.resolve(), opts.spec.name)


def probe(opts: Options) -> dict:
    """What the loader is (kind, class, its DataLoader's arguments or its callable's settings), from a fresh
    process, as every measured setting makes it."""
    return in_fresh_process(opts.spec.name, "the probe process", _describe, opts)


def _untunable(info: dict, name: str) -> str:
    """Why --tune has nothing to set on this loader, and what it would need."""
    what = (
        "--tune sets a torch DataLoader's num_workers, prefetch_factor, persistent_workers and pin_memory, "
        "or passes num_parallel_calls, prefetch, private_threadpool_size (tf.data) or num_proc (DataFlow) "
        "to the callable (docs/loader.md)"
    )
    fn = name.rpartition(":")[2]
    if info["kind"] == "dataset":
        return f"loader {name}: returns a map-style {info['class']} that feedbench batches itself: no workers to set; return a DataLoader over it ({what})"  # noqa: E501
    if info["kind"] in loader_settings.KNOBS:
        knobs = ", ".join(loader_settings.KNOBS[info["kind"]])
        return f"loader {name}: returns a {info['kind']} ({info['class']}), but {fn} takes none of {knobs} as a keyword argument ({what})"  # noqa: E501
    return f"loader {name}: returns {info['type']} (a plain iterable): it has no settings to tune ({what})"


def dataloader_grid(counts: list[int], gpu: bool) -> list[dict]:
    """A DataLoader's settings, cheapest first: fewer workers, then fewer batches in flight, then the default
    persistent_workers=False before True."""
    grid = [{"num_workers": 0, "prefetch_factor": None, "persistent_workers": None, "pin_memory": gpu}]
    for n in counts:
        for prefetch, persistent in ((2, False), (2, True), (4, True)):
            grid.append(
                {"num_workers": n, "prefetch_factor": prefetch, "persistent_workers": persistent, "pin_memory": gpu}
            )
    return grid


def callable_grid(kind: str, knobs: list[str], counts: list[int]) -> list[dict]:
    """tf.data's or a DataFlow's settings, cheapest first, each with only the keywords its callable takes."""
    if kind == "dataflow":
        return [{"num_proc": n} for n in [0, *counts]]
    grid: list[dict] = []
    for n in counts:
        for prefetch in (1, 2):
            full = {"num_parallel_calls": n, "prefetch": prefetch, "private_threadpool_size": n}
            setting = {k: v for k, v in full.items() if k in knobs}
            if setting not in grid:
                grid.append(setting)
    return grid


def plan(info: dict, name: str, max_parallel: int, gpu: bool) -> tuple[list[dict], list[dict]]:
    """(the settings to try, cheapest first; the settings not tried and why), or ConfigError where there are none."""
    counts = worker_counts(max_parallel)
    if info["kind"] == "dataloader":
        return dataloader_grid(counts, gpu), [{"setting": "pin_memory", "why": ON_GPU if gpu else NO_GPU}]
    if info["kind"] in loader_settings.KNOBS and info["knobs"]:
        fn = name.rpartition(":")[2]
        missing = [k for k in loader_settings.KNOBS[info["kind"]] if k not in info["knobs"]]
        skipped = [{"setting": k, "why": f"{fn} does not take it as a keyword argument"} for k in missing]
        return callable_grid(info["kind"], info["knobs"], counts), skipped
    raise ConfigError(_untunable(info, name))


def spec_with(spec: LoaderSpec, kind: str, setting: dict) -> LoaderSpec:
    """The loader with `setting`: its DataLoader made again with it, or its callable given it."""
    if kind == "dataloader":
        return dataclasses.replace(spec, settings=tuple(setting.items()))
    return dataclasses.replace(spec, args=tuple({**dict(spec.args), **setting}.items()))


def setting_words(setting: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items() if v is not None)


def short_label(setting: dict) -> str:
    """The setting as the timeline labels its window: each name by its initials (`nw=2 pf=4 pw=True`)."""
    return " ".join(f"{''.join(w[0] for w in k.split('_'))}={v}" for k, v in setting.items() if v is not None)


# The setting that meets the demand is measured in this many fresh processes in all: the line is pasted into
# a new process, and one process's rate differs from the next's by more than its own slices vary.
CONFIRM_PROCESSES = 3


def search(opts: Options, kind: str, grid: list[dict], demand: Demand, timeline: Timeline | None) -> list[dict]:
    """Each setting measured in turn (one copy of the loader, the sweep's measurement) until one meets the demand,
    that one in CONFIRM_PROCESSES fresh processes."""
    tried = []
    checks = _DuplicateChecks()
    for setting in grid:
        at = dataclasses.replace(opts, spec=spec_with(opts.spec, kind, setting))
        points = [measure(at, 1, timeline, short_label(setting))]
        if (points[0]["images_per_sec"] or 0) >= demand.total:
            points += [
                measure(at, 1, timeline, f"{short_label(setting)} #{i}") for i in range(2, CONFIRM_PROCESSES + 1)
            ]
        row = tune_row(setting, points, demand.total)
        row["duplicates"] = checks.of(at, kind, setting)
        tried.append(row)
        over = f" (median of {len(points)} fresh processes)" if len(points) > 1 else ""
        print(
            f"  {setting_words(setting)}: {rate_words(row)}{over}, {row['cpu_cores']:.2f} CPU cores, "
            f"{row['rss_mb']:.0f} MB",
            flush=True,
        )
        if row["meets"]:
            break
    return tried


class _DuplicateChecks:
    """Each DataLoader worker count's epoch against one process's (core/loader_duplicates.py), counted once per
    count, in a fresh process; none at all once the loader shows it cannot repeat samples per worker."""

    def __init__(self) -> None:
        self.found: dict[int, dict | None] = {}
        self.possible = True

    def of(self, opts: Options, kind: str, setting: dict) -> dict | None:
        """The `duplicates` figures of a setting (None: each sample once per epoch, or nothing to check)."""
        n = setting.get("num_workers") or 0
        if kind != "dataloader" or n < 2 or not self.possible:
            return None
        if n not in self.found:
            try:
                workers, counts = samples_per_epoch(opts, [n])
            except LoaderError as e:
                return {"checked": False, "num_workers": n, "why": str(e)}
            self.possible = counts is not None
            self.found[n] = duplicates(counts, workers)
        return self.found[n]


def tune_row(setting: dict, points: list[dict], demand: float) -> dict:
    """One setting's row from its processes' points: the figures of the process with the median rate; with
    several, the interval runs from the lowest process's low end to the highest's high end (what a fresh
    process may give, and so holding the median), at the least of their confidences. It meets the demand only
    where every process measured a rate (runner/loader_only.py: enough slices) and the median reaches it."""
    measured = [p for p in points if p["images_per_sec"] is not None]
    mid = sorted(measured, key=lambda p: p["images_per_sec"])[len(measured) // 2] if measured else points[0]
    keys = ("images_per_sec", "not_measured", "batches", "slice_rates", "interval", "interval_confidence",
            "cpu_cores", "rss_mb", "window_s")  # fmt: skip
    row = {"setting": setting, **{k: mid[k] for k in keys}}
    if len(points) > 1:
        if measured:
            row["interval"] = [min(p["interval"][0] for p in measured), max(p["interval"][1] for p in measured)]
            row["interval_confidence"] = min(p["interval_confidence"] for p in measured)
        row["process_rates"] = [p["images_per_sec"] for p in points]
        if len(measured) < len(points):
            row["not_measured"] = f"{len(points) - len(measured)} of {len(points)} processes not measured"
    row["meets"] = len(measured) == len(points) and row["images_per_sec"] >= demand
    return row


def main(args) -> int:
    """The CLI of --loader-only --tune (bench_input.py hands over its parsed flags, checked)."""
    from profiler import tune_report

    spec = LoaderSpec.parse(args.loader, args.loader_arg)
    spec.resolve()
    demand = demand_of(args)
    opts = Options(spec, batch=args.batch or 64, seconds=args.loader_seconds, timeout=args.loader_timeout)
    timeline = Timeline(LOADER_STAGE) if args.out else None  # timeline.{json,png} beside tune.json
    with private_tmpdir(), timeline or contextlib.nullcontext():
        info = probe(opts)
        grid, skipped = plan(info, spec.name, args.loader_workers or os.cpu_count() or 1, bool(nvidia_gpus()))
        print(
            f"loader {spec.name} ({info['class']}) alone (no trainer): up to {len(grid)} setting(s), "
            f"{opts.seconds:g} s each, cheapest first, until one gives {demand.total:.0f} images/s",
            flush=True,
        )
        tried = search(opts, info["kind"], grid, demand, timeline)
        stages = None
        if not tried[-1]["meets"] and not args.no_stages:
            stages = stage_timing(spec, opts.timeout)  # which stage limits the loader
    doc = tune_report.document(spec, info, demand, tried, skipped, stages, os.cpu_count() or 1)
    extra = timeline_files(timeline.document()) if timeline else None
    return print_and_write(args, doc, tune_report, extra)
