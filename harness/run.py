"""One run of bench_input.py, whatever the framework: defaults, checks, the paths, the report, the files.

A framework's plugin (`Trainer`, found by `load`: harness/tf/run.py,
harness/torch/plugin.py) trains; this module decides what is run (every
path, a capacity search, a sweep, `make bench`'s two parts) and says what
came out, as text and as data: one JSON document for every framework
(docs/results.schema.json). A run's document and a sweep's share their
blocks: `framework`, `config`, `device`, `model`, `started`, and per grid
point `paths`. `--json` writes a run's document; `--out` writes it (or a
sweep's) with flat `rows` as results.json, .csv, .md and .png (a capacity
run's rows and results.md carry each path's capacity; its results.png is
the capacity chart), each file atomically, a set an earlier run left in the
folder kept in its `earlier/` folder. Both trainers go through the same
functions, so a figure, a line of the report and a field of the JSON mean
the same thing for TensorFlow and PyTorch.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from consumers import declared
from core import registry
from core.config import BASELINE, BenchConfig, apply_defaults
from core.errors import ConfigError
from profiler.gpu_state import GpuState
from profiler.timeline import Timeline, take_clocks
from profiler.timeline import out_files as timeline_files

MEMORY_SHARE = 16  # a run keeps about this many batches in memory (queues, staging, producer pools)


# Where each framework's plugin lives; importing it is the only place a framework is loaded.
PLUGINS = {"tf": "harness.tf.plugin", "torch": "harness.torch.plugin"}


class Trainer(Protocol):
    """A framework plugin, as the harness (harness/run.py) drives it.

    The harness owns the run: it applies the machine's defaults, checks the
    configuration, prints the table and verdicts and writes the files. The
    plugin only knows its framework: how many devices it sees, what it adds
    to the defaults, and how to train a list of input paths.
    """

    framework: str  # "tf" or "torch", as in --framework and the registry
    words: str  # "TensorFlow 2.21.0": how the header and the JSON name the trainer

    def gpu_count(self) -> int:
        """The GPUs this framework can use (0 on a CPU machine); refuses (ConfigError) a GPU it cannot see."""
        ...

    def defaults(self, cfg: BenchConfig, gpus: int) -> list[str]:
        """The plugin's own defaults on top of core.config.apply_defaults, as notes for the user."""
        ...

    def check(self, cfg: BenchConfig, gpus: int) -> None:
        """Refuse (ConfigError) a grid point this machine cannot run, before anything starts."""
        ...

    def devices(self, cfg: BenchConfig) -> int:
        """Devices trained in one run of `cfg` (towers, or ranks on every node)."""
        ...

    def header(self, cfg: BenchConfig, model: str, gpus: int) -> str:
        """The run's first line: the trainer, `model` (the model's words), devices, batch and schedule."""
        ...

    def describe(self) -> dict[str, Any]:
        """The machine and the framework's versions, for the report's `device` block."""
        ...

    def config_fields(self) -> dict[str, Any]:
        """Fields the framework adds to the report's `config` (e.g. nodes)."""
        ...

    def run(self, cfg: BenchConfig) -> dict[str, dict] | None:
        """Train every path of `cfg.paths` in turn; {path: result}, or None where another process reports."""
        ...

    def run_in_turn(self, cfg: BenchConfig) -> list[dict]:
        """Train `cfg.paths` in the order given, a path as often as it is named (--interleave's alternation);
        one result per entry, on one machine."""
        ...

    def how_to_open(self, profile_dir: str) -> str:
        """What to type to look at a --profile folder."""
        ...


def load(framework: str, args: Any) -> Trainer:
    """The plugin of `framework` (importing its framework), for the parsed flags `args`."""
    if framework not in PLUGINS:
        raise ConfigError(f"--framework {framework!r}: choose from {', '.join(sorted(PLUGINS))}")
    return importlib.import_module(PLUGINS[framework]).plugin(args)


def model_words(cfg: BenchConfig, rates: list[float] | None = None) -> str:
    """What the run trains: ResNet-50, or an emulated device labelled with its rate and the rate's source."""
    if cfg.model == "emulated" and cfg.emulation:
        from core.emulate import rate_text

        e = cfg.emulation
        rate = ", ".join(rate_text(r) for r in rates) if rates else rate_text(e["images_per_sec"])
        return f"emulated {e['device']} ({rate} img/s per device) [source: {e['source']}]"
    return f"ResNet-50 v{cfg.resnet_version}{' (input only)' if cfg.input_only else ''}"


def check_machine(cfg: BenchConfig, gpus: int) -> None:
    """Devices the machine has, and a batch it can hold (ConfigError)."""
    import psutil

    if gpus and cfg.num_gpus > gpus:
        raise ConfigError(f"--num-gpus {cfg.num_gpus}: only {gpus} GPU(s) on this machine")
    if not gpus and cfg.dali_device == "gpu":
        raise ConfigError("--dali-device gpu: no GPU here; DALI decodes on the CPU (--dali-device cpu)")
    if not gpus and cfg.num_gpus > (os.cpu_count() or 1):
        raise ConfigError(
            f"--num-gpus {cfg.num_gpus}: no GPU here, and towers on CPU are limited to the {os.cpu_count()} CPU cores"
        )
    batch_bytes = cfg.batch * cfg.image_size * cfg.image_size * 3
    available = psutil.virtual_memory().available
    if batch_bytes * MEMORY_SHARE > available:
        raise ConfigError(
            f"--image-size {cfg.image_size}: one batch of {cfg.batch} is {batch_bytes / 1e9:.1f} GB, and a run keeps "
            f"about {MEMORY_SHARE} batches in memory; this machine has {available / 1e9:.1f} GB available"
        )


def prepare(plugin: Trainer, cfg: BenchConfig, gpus: int) -> list[str]:
    """The machine's defaults (core.config, then the plugin's) applied to `cfg`, checked; the notes to print."""
    notes = apply_defaults(cfg, gpus) + plugin.defaults(cfg, gpus)
    check_machine(cfg, gpus)
    plugin.check(cfg, gpus)
    return notes


def main(plugin: Trainer, cfg: BenchConfig, base: BenchConfig, grid: dict | None, out: str | None, bench: bool) -> int:
    """bench_input.py after its flag checks: `cfg` as given, `base` before any defaults (a sweep's points)."""
    gpus = plugin.gpu_count()
    if grid is not None:
        return sweep(plugin, base, grid, gpus, out or "results")
    for note in prepare(plugin, cfg, gpus):
        print(f"note: {note}")
    timeline = Timeline("trainer") if out else None  # timeline.{json,png} beside the results (docs/results.md)
    global GPU_STATE
    GPU_STATE = GpuState.open(cfg.num_gpus) if gpus else None  # each window's clocks and power (NVML)
    with timeline or contextlib.nullcontext(), GPU_STATE or contextlib.nullcontext():
        if timeline is not None and GPU_STATE is not None:
            timeline.gauges["gpu"] = GPU_STATE.since_last
        started, results = run_paths(plugin, cfg, gpus, batch_given=base.batch is not None, timeline=timeline)
    GPU_STATE = None
    if results is None:
        return 0  # another node of the run writes the report
    report(plugin, cfg, results, out, started, gpus, bench=bench, timeline=timeline)
    code = max(_failed(results), untrained(results))
    if bench and not gpus:
        # Without a GPU every path keeps up with a CPU ResNet-50: ask instead how many emulated
        # H100s each path would keep fed (docs/emulated.md).
        cap = replace(base, model="emulated", emulate=base.emulate or "H100", find_capacity=True, shrunk={})
        cap.batch = cap.image_size = cap.warmup_steps = cap.steps = cap.repeats = None
        cap.interleave = 0  # a capacity search's probes are not interleaved (its results say so)
        if cap.json_path:
            cap.json_path = cap.json_path.removesuffix(".json") + "-capacity.json"
        for note in prepare(plugin, cap, gpus):
            print(f"note: {note}")
        print()
        started, results = run_paths(plugin, cap, gpus, batch_given=False)
        report(plugin, cap, results, os.path.join(out, "capacity") if out else None, started, gpus)
        code = max(code, _failed(results))
        if cap.transport != "shm" and "zmq-consume" in cap.paths:  # the same-host answer, beside ipc's
            shm = replace(cap, transport="shm", paths=[BASELINE, "zmq-consume"])
            if shm.json_path:
                shm.json_path = shm.json_path.removesuffix("-capacity.json") + "-capacity-shm.json"
            print("\nzmq-consume over shared memory (--transport shm), with its own baseline:")
            started, results = run_paths(plugin, shm, gpus, batch_given=False)
            report(plugin, shm, results, os.path.join(out, "capacity-shm") if out else None, started, gpus)
            code = max(code, _failed(results))
    return code


def _failed(results: dict[str, dict]) -> int:
    """2 if a path's capacity probes failed (one error line each, after every other result was written)."""
    from runner.capacity import failed_lines

    lines = failed_lines(results)
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    return 2 if lines else 0


GPU_STATE: GpuState | None = None  # the run's NVML sampler while `main` runs its paths (profiler/gpu_state.py)


def untrained(results: dict[str, dict]) -> int:
    """3 if a path's model did not train (profiler/training.py), one line each, after every result was written."""
    from profiler.training import invalid_reason, invalid_words

    bad = {path: reason for path, r in results.items() if (reason := invalid_reason(r))}
    for path, reason in bad.items():
        print(f"error: {path}: {invalid_words(reason)}: its figures are not reported", file=sys.stderr)
    return UNTRAINED_EXIT if bad else 0


UNTRAINED_EXIT = 3  # the run finished and wrote its results, but a path's model did not train


def run_paths(
    plugin: Trainer, cfg: BenchConfig, gpus: int, batch_given: bool, timeline: Timeline | None = None
) -> tuple[float, dict[str, dict] | None]:
    """(start time, {path: result}): every chosen path in turn, or with --find-capacity each path's capacity.

    `batch_given`: --batch was on the command line (a capacity probe keeps it; otherwise it follows the rate).
    `timeline`: gets each path's step clock (its delivered images/s and timed windows).
    """
    from consumers.declared import batch_maker_line

    if cfg.find_capacity:
        from runner.capacity import find_capacities

        print(f"capacity: each path against {model_words(cfg)}; probes of a few seconds", flush=True)
        if words := batch_maker_line(cfg, plugin.framework):
            print(words, flush=True)
        started = time.time()
        results, _ = find_capacities(
            cfg, lambda c, path: one_path(plugin, c, path, timeline), batch_given, confirm=cfg.capacity_tries
        )
        return started, results
    print(plugin.header(cfg, model_words(cfg), gpus), flush=True)
    if words := batch_maker_line(cfg, plugin.framework):  # who makes the batches: synthetic, decoded JPEGs, a loader
        print(words, flush=True)
    if "dali" in cfg.paths or cfg.producer_kind == "dali":
        print(f"DALI decodes on the {cfg.dali_device.upper()} (--dali-device)", flush=True)
    started = time.time()
    results = train(plugin, cfg, timeline)
    paths = [p for p in cfg.paths if p != BASELINE]
    if results is not None and cfg.interleave and paths:
        from harness.interleave import alternate

        print(f"- {', '.join(paths)}: {cfg.interleave} pairs of runs each, alternating with the baseline ...",
              flush=True)  # fmt: skip
        for path, block in alternate(lambda c: train_in_turn(plugin, c, timeline), cfg, paths, cfg.interleave).items():
            results[path]["interleaved"] = block
            print(f"  {path}: median paired ratio {block['ratio']:.3f}", flush=True)
    return started, results


def train(plugin: Trainer, cfg: BenchConfig, timeline: Timeline | None = None) -> dict[str, dict] | None:
    """`plugin.run(cfg)`, each path's step clock moved out of its result into `timeline` (or dropped)."""
    results = plugin.run(cfg)
    for path, r in (results or {}).items():
        train_done(r, path, timeline)
    return results


def train_done(result: dict, path: str, timeline: Timeline | None) -> None:
    """A path's result as it came back: the GPU's state beside each timed window (by its step clock's windows),
    then the step clock moved into `timeline` (or dropped)."""
    if GPU_STATE is not None:  # each timed window's GPU clocks, power and throttling
        result["gpu_state"] = GPU_STATE.windows((result.get("clock") or {}).get("windows") or [])
    take_clocks({path: result}, timeline)


def train_in_turn(plugin: Trainer, cfg: BenchConfig, timeline: Timeline | None = None) -> list[dict]:
    """`plugin.run_in_turn(cfg)`, each result's GPU state and step clock taken as `train` takes them."""
    runs = plugin.run_in_turn(cfg)
    for r, path in zip(runs, cfg.paths, strict=True):
        train_done(r, path, timeline)
    return runs


def one_path(plugin: Trainer, cfg: BenchConfig, path: str, timeline: Timeline | None = None) -> dict:
    """One path's result, run on its own (a capacity probe), without the per-path progress lines."""
    results = train(plugin, replace(cfg, paths=[path], quiet=True), timeline)
    if results is None:
        raise ConfigError("a capacity probe ran on several machines (core/registry.py LIMITS refuses that)")
    return results[path]


def each_path(cfg: BenchConfig, run_path: Callable[[BenchConfig, str], dict]) -> dict[str, dict]:
    """Every path of `cfg` in turn through `run_path`, one line each as it finishes: a plugin's `run`."""
    results: dict[str, dict] = {}
    for path in cfg.paths:
        t0 = time.perf_counter()
        if not cfg.quiet:
            print(f"- {path} ...", flush=True)
        r = results[path] = run_path(cfg, path)
        if not cfg.quiet:
            print(f"  {r['images_per_sec']['median']:.1f} images/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    return results


def report(
    plugin: Trainer,
    cfg: BenchConfig,
    results: dict[str, dict],
    out: str | None,
    started: float,
    gpus: int,
    bench: bool = False,
    timeline: Timeline | None = None,
) -> None:
    """The tables, the verdicts, and the files asked for (--out, --json): the same for every framework.

    `bench`: `make bench`'s first half, which an emulated capacity table follows on a machine without a GPU.
    `timeline`: the run's samples, written as timeline.{json,png} with --out's other files.
    """
    from profiler import report as tables
    from profiler.cluster_report import rank_lines
    from profiler.first_batch import line as first_batch_line
    from profiler.real_data import text as real_data_text
    from profiler.sweep import rows_of
    from profiler.verdict import verdicts_text

    tables.add_ratios(results, steps_per_window=cfg.steps)
    print()
    if cfg.model == "emulated":
        print(model_words(cfg))
    print(tables.table(results, plugin.devices(cfg), cfg.input_only))
    if words := first_batch_line(results):
        print(words)
    if bench and (caveat := tables.cpu_caveat(results, gpus > 0, cfg.model)):
        print(caveat)
    for line in rank_lines(results):
        print(line)
    if cfg.find_capacity:
        from runner.capacity import table as capacity_table

        print()
        print(capacity_table(results))
    if cfg.telemetry:
        print()
        print(verdicts_text(results, framework=plugin.framework))
    if cfg.real_data:  # each path's input cores and the cores it would need (profiler/real_data.py)
        print("\n" + real_data_text(results, BASELINE, cfg))
    if cfg.profile_dir:
        print()
        print(plugin.how_to_open(cfg.profile_dir))
    doc = run_document(plugin, cfg, results, started)
    if cfg.json_path:  # first: what --out's folder holds cannot cost the run its --json
        tables.write_json(cfg.json_path, doc)
        print(f"\nwrote {cfg.json_path}")
    if out:
        extra = timeline_files(timeline.document()) if timeline is not None else None
        files = write_out(
            out, plugin.framework, {**doc, "rows": rows_of([{"config": doc["config"], "paths": results}])}, cfg, extra
        )
        print("\n" + "\n".join(f"wrote {f}" for f in files))


def sweep(plugin: Trainer, base: BenchConfig, grid: dict, gpus: int, out: str) -> int:
    """--sweep: every grid point's paths, each point checked before the first starts; results.* in `out`."""
    from tqdm import tqdm

    from profiler import report as tables
    from profiler.progress import interactive
    from profiler.sweep import points
    from profiler.verdict import add_verdicts

    configs = points(base, grid)
    notes = []
    for point in configs:  # every grid point, before the first starts
        notes.append(prepare(plugin, point, gpus))
    for note in notes[0]:
        print(f"note: {note}")
    runs = []
    started = time.time()
    bar = tqdm(total=len(configs), desc="sweep", unit="point", disable=not interactive(), dynamic_ncols=True)
    try:
        for i, cfg in enumerate(configs, 1):
            point = (
                f"{cfg.num_gpus} device(s), batch {cfg.batch}, fp16 {'on' if cfg.use_fp16 else 'off'}, "
                f"XLA {'on' if cfg.use_xla_compile else 'off'}"
            )
            print(f"[{i}/{len(configs)}] {point}: {plugin.header(cfg, model_words(cfg), gpus)}", flush=True)
            results = train(plugin, cfg)
            bar.update(1)
            if results is None:
                continue  # another node writes the report
            tables.add_ratios(results, steps_per_window=cfg.steps)
            if cfg.telemetry:
                add_verdicts(results, framework=plugin.framework)
            runs.append({"config": config_of(plugin, cfg), "paths": results})
    finally:
        bar.close()
    if not runs:
        return 0
    doc = sweep_document(plugin, grid, runs, started, model_words(configs[0], grid.get("emulate_rate")))
    files = write_out(out, plugin.framework, doc, None)
    print()
    print(open(os.path.join(out, "results.md")).read())
    print("\n".join(f"wrote {f}" for f in files))
    return 0


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
