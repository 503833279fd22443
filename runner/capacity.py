"""--find-capacity: run the capacity search (profiler/capacity.py) for every path of a run.

Framework-neutral: the trainer's `run_path(cfg, path)` is passed in. Each
probe is a short run (a few warm-up steps and one timed window) with the
emulated rate per device set to the probed rate; without --batch, the batch
follows the rate so that a step lasts about the same time at every rate.
The gpu baseline is measured at the preset's rate (twice, the better run
counts) and at each path's
capacity; between those, its efficiency (achieved / set rate) is taken as
measured at the preset's rate, unless the machine could not step the
devices at half that rate: then the baseline at a rate is the demand, at
most what it delivered. A capacity is never more than its probe delivered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from core.config import BASELINE, BenchConfig, emulated_batch
from core.emulate import rate_text
from profiler.capacity import CapacitySearch

PROBE_STEPS = {"warmup_steps": 8, "steps": 20, "repeats": 1}
LOW_EFFICIENCY = 0.5  # below this share of the set rate, the machine, not the path, limits the baseline


def probe_config(cfg: BenchConfig, rate: float, batch_given: bool) -> BenchConfig:
    """The run configuration of one probe at `rate` images/s per device."""
    emulation = {**cfg.emulation, "images_per_sec": rate}
    # The producers fill their queues while the trainer starts: up to --hwm batches at each end of each
    # worker's connection, the receiver's own queue and a staged batch per tower. A throttled producer's
    # backlog drained inside the measured window would read as a rate it cannot sustain, so the warm-up
    # takes at least that many batches.
    queued = cfg.producers * max(1, cfg.producer_workers) * 2 * cfg.hwm + cfg.hwm + cfg.num_gpus
    steps = {**PROBE_STEPS, "warmup_steps": max(PROBE_STEPS["warmup_steps"], -(-queued // max(1, cfg.num_gpus)) + 2)}
    return replace(
        cfg,
        emulate_rate=rate,
        emulation=emulation,
        batch=cfg.batch if batch_given else emulated_batch(rate),
        json_path=None,
        profile_dir=None,
        **steps,
    )


def find_capacities(
    cfg: BenchConfig,
    run_path: Callable[[BenchConfig, str], dict],
    batch_given: bool,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, dict], dict]:
    """({path: its result at the preset's rate, with "capacity"}, the baseline's figures)."""
    towers = cfg.num_gpus
    start = cfg.emulation["images_per_sec"]
    preset_rate = start
    # Twice: the first run of a process also pays for loading TensorFlow's kernels and the op.
    runs = [run_path(probe_config(cfg, start, batch_given), BASELINE) for _ in range(2)]
    base0 = max(runs, key=lambda r: r["images_per_sec"]["median"])
    base0_ips = base0["images_per_sec"]["median"]
    efficiency = base0_ips / (start * towers)
    log(
        f"  gpu baseline at {rate_text(start)} img/s per device: {rate_text(base0_ips)} img/s "
        f"({100 * efficiency:.1f}% of the set {rate_text(start * towers)})"
    )
    if efficiency < LOW_EFFICIENCY:
        log(
            f"  note: the emulated devices step at only {100 * efficiency:.2g}% of the set rate on this machine; "
            "each capacity is at most what its probes delivered"
        )

    def baseline(rate: float) -> float:
        if rate == start:
            return base0_ips
        if efficiency < LOW_EFFICIENCY:  # the machine caps the devices: no more than the demand or that cap
            return min(rate * towers, base0_ips)
        return efficiency * rate * towers

    results: dict[str, dict] = {BASELINE: base0}
    for path in cfg.paths:
        if path == BASELINE:
            continue
        first: dict = {}

        def probe(rate: float, path: str = path, first: dict = first) -> dict:
            r = run_path(probe_config(cfg, rate, batch_given), path)
            log(
                f"  {path}: demand {rate_text(rate * towers)} img/s ({rate_text(rate)} per device) -> "
                f"{rate_text(r['images_per_sec']['median'])} img/s"
            )
            if not first:
                first.update(r)
            return r

        found = CapacitySearch(towers, probe, baseline).run(start)
        if found["rate_per_device"] is not None:
            at = run_path(probe_config(cfg, found["rate_per_device"], batch_given), BASELINE)
            found["baseline_at_capacity"] = at["images_per_sec"]["median"]
            found["ratio_at_capacity"] = (found["achieved_images_per_sec"] or 0) / found["baseline_at_capacity"]
        found["devices"] = found["images_per_sec"] / preset_rate if found["images_per_sec"] else 0.0
        found["device"] = cfg.emulation["device"]
        found["device_images_per_sec"] = preset_rate
        results[path] = {**first, "capacity": found}
    base0["capacity"] = {
        "images_per_sec": base0_ips,
        "rate_per_device": start,
        "devices": base0_ips / preset_rate,
        "device": cfg.emulation["device"],
        "device_images_per_sec": preset_rate,
        "efficiency": efficiency,
        "probes": [],
    }
    return results, {"images_per_sec": base0_ips, "efficiency": efficiency}


def table(results: dict[str, dict]) -> str:
    """The capacity table: images/s and emulated devices per path."""
    from tabulate import tabulate

    rows = []
    for path, r in results.items():
        c = r.get("capacity")
        if not c:
            continue
        if path == BASELINE:
            rows.append([path, rate_text(c["images_per_sec"]), f"{c['devices']:.2f}", "baseline", "-"])
            continue
        lo, hi = c["bracket_per_device"]
        cap = "< lowest probe" if c["images_per_sec"] is None else rate_text(c["images_per_sec"])
        if hi is None and c["images_per_sec"] is not None:
            cap = ">= " + cap
        rows.append([path, cap, f"{c['devices']:.2f}", str(len(c["probes"])), _bracket(lo, hi)])
    device = next((r["capacity"]["device"] for r in results.values() if r.get("capacity")), "?")
    return tabulate(
        rows,
        headers=["input path", "capacity img/s", f"emulated {device}s", "probes", "bracket per device"],
        disable_numparse=True,
    )


def _bracket(lo: float | None, hi: float | None) -> str:
    a = "-" if lo is None else rate_text(lo)
    b = "-" if hi is None else rate_text(hi)
    return f"{a} ok / {b} short"
