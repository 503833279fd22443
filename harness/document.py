"""The report as data: one JSON document for every framework (docs/results.schema.json), and the files written.

A run's document and a sweep's share their blocks: `framework`, `config`,
`device`, `model`, `started`, and per grid point `paths`. `--json` writes
a run's document; `--out` writes it (or a sweep's) with flat `rows` as
results.json, .csv, .md and .png (a capacity run's rows and results.md carry
each path's capacity; its results.png is the capacity chart). Every file is
written atomically, and a set an earlier run left in the folder is kept in
its `earlier/` folder.
"""

from __future__ import annotations

from typing import Any

from consumers import declared
from core import registry
from core.config import BenchConfig
from harness.plugin import Trainer


def config_of(plugin: Trainer, cfg: BenchConfig) -> dict[str, Any]:
    """The run's configuration as the report gives it: every BenchConfig field and the framework's."""
    return {**cfg.to_dict(), "framework": plugin.framework, **plugin.config_fields()}


def model_of(cfg: BenchConfig) -> dict[str, Any]:
    """What the devices ran; an emulated device says so, with its rate and the rate's source (docs/emulated.md)."""
    if cfg.model == "emulated":
        return dict(cfg.emulation)
    return {"emulated": False, "name": "ResNet-50", "version": cfg.resnet_version, "input_only": cfg.input_only}


def run_document(plugin: Trainer, cfg: BenchConfig, results: dict[str, dict], started: float) -> dict[str, Any]:
    """A run's document: its configuration, machine, model, the baseline, each path's result and capacity."""
    base = results.get(registry.BASELINE, {})
    config = config_of(plugin, cfg)
    return {
        "framework": plugin.framework,
        "trainer": plugin.words,
        "config": config,
        "device": plugin.describe(),
        "model": model_of(cfg),
        "reference": {"baseline": registry.BASELINE, "baseline_images_per_sec": base.get("images_per_sec")},
        "started": started,
        "paths": results,
        # Per path: the highest demand sustained at >= 97% of the baseline, with every probe tried.
        "capacity": {p: r["capacity"] for p, r in results.items() if r.get("capacity")} or None,
    }


def sweep_document(plugin: Trainer, grid: dict, runs: list[dict], started: float, model: str) -> dict[str, Any]:
    """A sweep's document: the grid, and per point its configuration and paths, with flat rows."""
    from profiler.sweep import rows_of

    size = runs[0]["config"]["image_size"]
    return {
        "framework": plugin.framework,
        "trainer": plugin.words,
        "grid": dict(grid),
        "device": plugin.describe(),
        "started": started,
        "title": f"{plugin.words}, {model}, {size}px",
        "rows": rows_of(runs),
        "runs": runs,
    }


def write_out(
    out: str, framework: str, doc: dict, cfg: BenchConfig | None, extra: dict[str, str | bytes] | None = None
) -> list[str]:
    """--out: results.{json,csv,md,png}, all of them or none; an earlier set there is kept (profiler/earlier.py).

    A capacity run's results.png is the capacity chart: the paths ranked by their capacity, as its table and
    results.md rank them, not by the first probe's images/s. `extra`: more files of the run (its timeline).
    """
    from profiler.sweep import write_results

    extra = dict(extra or {})
    if cfg is not None and cfg.find_capacity:
        from profiler.plot import capacity_png

        extra["results.png"] = capacity_png(doc["paths"])
    return write_results(out, doc, declared.names(framework), extra)
