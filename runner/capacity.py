"""--find-capacity: run the capacity search (profiler/capacity.py) for every path of a run.

Framework-neutral: the trainer's `run_path(cfg, path)` is passed in. Each
probe is a short run (a warm-up of at least 3 s at the probed demand, so a
path's slow start is not what is measured, then one timed window of at least
1.5 s) with the emulated rate per device set to the probed rate; without
--batch, the batch follows the rate so that a step lasts about the same time
at every rate.
The gpu baseline is measured at the preset's rate (twice, the better run
counts) and at each path's
capacity; between those, its efficiency (achieved / set rate) is taken as
measured at the preset's rate, unless the machine could not step the
devices at half that rate: then the baseline at a rate is the demand, at
most what it delivered. A capacity is never more than its probe delivered.

A probe that fails (a crashed rank, a lost producer) is run once more; a
path whose probe fails again gets no capacity, and the other paths' results
are kept (the baseline's `capacity.failed` names it and says why).

Each capacity comes with an interval (profiler/capacity.py: the decisive
probes are tried again), the baseline's from its runs after the first; the
table says which paths' intervals overlap: those this run cannot rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from core.config import BASELINE, BenchConfig, emulated_batch
from core.emulate import rate_text
from core.errors import ConfigError, FeedbenchError
from profiler.capacity import CONFIRM, CapacitySearch, overlap

PROBE_STEPS = {"warmup_steps": 8, "steps": 20, "repeats": 1}
# A probe measures the path at the demand, not its start-up: the warm-up lasts at least --probe-warmup
# seconds at the demand's step time, and the timed window at least --probe-window (a batch that follows the
# rate makes these a few dozen steps; a given --batch at a high rate makes them more, up to MAX_PROBE_STEPS).
MAX_PROBE_STEPS = 500
LOW_EFFICIENCY = 0.5  # below this share of the set rate, the machine, not the path, limits the baseline


def probe_config(cfg: BenchConfig, rate: float, batch_given: bool) -> BenchConfig:
    """The run configuration of one probe at `rate` images/s per device."""
    emulation = {**cfg.emulation, "images_per_sec": rate}
    # The producers fill their queues while the trainer starts: up to --hwm batches at each end of each
    # worker's connection, the receiver's own queue and a staged batch per tower. A throttled producer's
    # backlog drained inside the measured window would read as a rate it cannot sustain, so the warm-up
    # takes at least that many batches.
    queued = cfg.producers * max(1, cfg.producer_workers) * 2 * cfg.hwm + cfg.hwm + cfg.num_gpus
    batch = cfg.batch if batch_given else emulated_batch(rate)
    # A slow start (workers spinning up, caches filling) passes inside the warm-up: it lasts probe_warmup_s
    # at the demand (longer where the path is slower), the window probe_window_s.
    step_s = batch / rate
    warmup = max(
        PROBE_STEPS["warmup_steps"],
        -(-queued // max(1, cfg.num_gpus)) + 2,
        math.ceil(cfg.probe_warmup_s / step_s),
    )
    steps = max(PROBE_STEPS["steps"], math.ceil(cfg.probe_window_s / step_s))
    return replace(
        cfg,
        emulate_rate=rate,
        emulation=emulation,
        batch=batch,
        json_path=None,
        profile_dir=None,
        warmup_steps=min(warmup, MAX_PROBE_STEPS),
        steps=min(steps, MAX_PROBE_STEPS),
        repeats=PROBE_STEPS["repeats"],
    )


def find_capacities(
    cfg: BenchConfig,
    run_path: Callable[[BenchConfig, str], dict],
    batch_given: bool,
    log: Callable[[str], None] = print,
    confirm: int = CONFIRM,
) -> tuple[dict[str, dict], dict]:
    """({path: its result at the preset's rate, with "capacity"}, the baseline's figures).

    `confirm`: extra tries at each path's two decisive probes (0: one probe each, no interval to speak of).
    """
    towers = cfg.num_gpus
    start = preset_rate = cfg.emulation["images_per_sec"]
    base0, base_range = _baseline_runs(cfg, run_path, batch_given, log, confirm)
    base0_ips = base0["images_per_sec"]["median"]
    efficiency = base0_ips / (start * towers)

    def baseline(rate: float) -> float:
        if rate == start:
            return base0_ips
        if efficiency < LOW_EFFICIENCY:  # the machine caps the devices: no more than the demand or that cap
            return min(rate * towers, base0_ips)
        return efficiency * rate * towers

    results: dict[str, dict] = {BASELINE: base0}
    failed: dict[str, str] = {}
    for path in cfg.paths:
        if path == BASELINE:
            continue
        try:
            results[path] = _path_capacity(cfg, path, run_path, baseline, batch_given, log, confirm)
        except ConfigError:
            raise
        except FeedbenchError as e:  # this path's probes failed twice: the other paths' results are kept
            failed[path] = str(e)
            log(f"  {path}: failed again; no capacity for it, the other paths go on")
    base0["capacity"] = {
        "images_per_sec": base0_ips,
        "interval": base_range,
        "rate_per_device": start,
        "devices": base0_ips / preset_rate,
        "device": cfg.emulation["device"],
        "device_images_per_sec": preset_rate,
        "efficiency": efficiency,
        "probes": [],
        **({"failed": failed} if failed else {}),
    }
    _mark_overlaps(results)
    return results, {"images_per_sec": base0_ips, "efficiency": efficiency, "failed": failed}


def _baseline_runs(
    cfg: BenchConfig,
    run_path: Callable[[BenchConfig, str], dict],
    batch_given: bool,
    log: Callable[[str], None],
    confirm: int,
) -> tuple[dict, list[float]]:
    """(the best baseline run at the preset's rate, [the least of the others, the best]), each said as it ends.

    The first run of a process also pays for loading TensorFlow's kernels and the op; the others give the
    baseline's spread.
    """
    start, towers = cfg.emulation["images_per_sec"], cfg.num_gpus
    runs: list[dict] = []
    for i in range(n := 2 + (1 if confirm else 0)):  # a line each: no minute of silence while they run
        runs.append(run_path(probe_config(cfg, start, batch_given), BASELINE))
        log(f"  gpu baseline run {i + 1}/{n}: {rate_text(runs[-1]['images_per_sec']['median'])} img/s")
    best = max(runs, key=lambda r: r["images_per_sec"]["median"])
    ips = best["images_per_sec"]["median"]
    efficiency = ips / (start * towers)
    log(
        f"  gpu baseline at {rate_text(start)} img/s per device: {rate_text(ips)} img/s "
        f"({100 * efficiency:.1f}% of the set {rate_text(start * towers)})"
    )
    if efficiency < LOW_EFFICIENCY:
        log(
            f"  note: the emulated devices step at only {100 * efficiency:.2g}% of the set rate on this machine; "
            "each capacity is at most what its probes delivered"
        )
    return best, [min(r["images_per_sec"]["median"] for r in runs[1:]), ips]


def _path_capacity(
    cfg: BenchConfig,
    path: str,
    run_path: Callable[[BenchConfig, str], dict],
    baseline: Callable[[float], float],
    batch_given: bool,
    log: Callable[[str], None],
    confirm: int,
) -> dict:
    """One path's result at its capacity's own probe (its first, below the lowest probe), with "capacity": the
    search, and the baseline at the capacity.

    A probe that fails (a crashed rank, a lost producer) is run once more; a second failure is raised.
    """
    towers, preset_rate = cfg.num_gpus, cfg.emulation["images_per_sec"]
    tried: list[tuple[float, dict]] = []  # (rate per device, result) of every probe, in order

    def probe(rate: float) -> dict:
        c = probe_config(cfg, rate, batch_given)
        try:
            r = run_path(c, path)
        except ConfigError:
            raise
        except FeedbenchError as e:
            why = str(e).removeprefix(f"{path}: ")
            log(f"  {path}: the probe at {rate_text(rate * towers)} img/s failed ({why}); running it once more")
            r = run_path(c, path)
        log(
            f"  {path}: demand {rate_text(rate * towers)} img/s ({rate_text(rate)} per device) -> "
            f"{rate_text(r['images_per_sec']['median'])} img/s"
        )
        tried.append((rate, r))
        return r

    found = CapacitySearch(towers, probe, baseline, max_probes=cfg.capacity_probes, confirm=confirm).run(preset_rate)
    own = tried[0][1]  # below the lowest probe: the first probe is all there is
    if found["rate_per_device"] is not None:
        at = run_path(probe_config(cfg, found["rate_per_device"], batch_given), BASELINE)
        found["baseline_at_capacity"] = at["images_per_sec"]["median"]
        found["ratio_at_capacity"] = (found["achieved_images_per_sec"] or 0) / found["baseline_at_capacity"]
        # The path's result, its table row and its verdict are the capacity's own probe, against the baseline
        # at that probe's demand (profiler/uncertainty.py baseline_for), not the first probe's.
        own = next(
            (r for rate, r in reversed(tried)
             if rate == found["rate_per_device"] and r["images_per_sec"]["median"] == found["achieved_images_per_sec"]),
            own,
        )  # fmt: skip
        found["baseline"] = {k: at[k] for k in ("images_per_sec", "step_time_ms", "schedule") if k in at}
    found["devices"] = found["images_per_sec"] / preset_rate if found["images_per_sec"] else 0.0
    found["device"] = cfg.emulation["device"]
    found["device_images_per_sec"] = preset_rate
    return {**own, "capacity": found}


def _mark_overlaps(results: dict[str, dict]) -> None:
    """Each path's `capacity.cannot_tell_from` (the other paths whose capacity intervals overlap its own) and
    `capacity.place` (its place in the ranking, shared with the paths it cannot be told from)."""
    caps = {p: r["capacity"] for p, r in results.items() if r.get("capacity") and p != BASELINE}
    for p, c in caps.items():
        c["cannot_tell_from"] = [q for q, d in caps.items() if q != p and overlap(c.get("interval"), d.get("interval"))]
    for place, group in enumerate(places(caps), 1):
        for p in group:
            caps[p]["place"] = place


def places(caps: dict[str, dict]) -> list[list[str]]:
    """The paths, best capacity first, in groups this run cannot order: paths whose intervals overlap share a
    group, and so do two paths that each overlap a third (a chain of overlaps ranks nothing along it).

    What a second run on the same machine reproduces: its single figures move with the machine, a place
    moves only when an interval clears another's.
    """
    groups: list[set[str]] = []
    for p, c in caps.items():
        joined = [g for g in groups if any(q in c.get("cannot_tell_from", ()) for q in g)]
        merged = {p}.union(*joined)
        groups = [g for g in groups if g not in joined] + [merged]

    def best(p: str) -> float:
        return caps[p].get("images_per_sec") or 0.0

    ordered = [sorted(g, key=best, reverse=True) for g in groups]
    return sorted(ordered, key=lambda g: best(g[0]), reverse=True)


def ranking_line(results: dict[str, dict]) -> str | None:
    """'ranking: 1. a ≈ b, 2. c': each place's paths, those this run cannot order joined by ≈ (None: < 2 paths)."""
    caps = {p: r["capacity"] for p, r in results.items() if r.get("capacity") and p != BASELINE}
    if len(caps) < 2 or any("place" not in c for c in caps.values()):
        return None
    groups = places(caps)
    text = ", ".join(f"{i}. {' ≈ '.join(g)}" for i, g in enumerate(groups, 1))
    return f"ranking by capacity: {text} (≈: intervals that overlap, directly or through another path)"


def _interval_text(c: dict) -> str:
    """The capacity's interval; an end this run did not bound (no probe kept up: 0; the first demand, where the
    search started) is said so, not given as a figure."""
    iv = c.get("interval")
    if not iv or iv[0] is None:
        return "-"
    first = c["probes"][0]["demand_images_per_sec"] if c.get("probes") else None
    if iv[1] is None:
        return f">= {rate_text(iv[0])} (not bounded above by this run)"
    lo, hi = _distinct(iv[0], iv[1])
    if iv[0] <= 0:
        return f"< {hi} (not bounded below by this run)"
    if first is not None and math.isclose(iv[1], first):
        return f">= {lo}, below the first demand {hi} (not bounded closer by this run)"
    return f"{lo}–{hi}"


def _distinct(a: float, b: float) -> tuple[str, str]:
    """Two different rates as texts that differ too: rate_text, with decimals added until they do."""
    ta, tb = rate_text(a), rate_text(b)
    digits = 1
    while ta == tb and a != b and digits <= 6:
        ta, tb = f"{a:,.{digits}f}", f"{b:,.{digits}f}"
        digits += 1
    return ta, tb


def overlap_lines(results: dict[str, dict]) -> list[str]:
    """One line per group of paths this run cannot rank (overlapping capacity intervals)."""
    lines, seen = [], set()
    for p, r in results.items():
        later = [q for q in (r.get("capacity") or {}).get("cannot_tell_from") or [] if (q, p) not in seen]
        seen.update((p, q) for q in later)
        if later:
            lines.append(
                f"{p} cannot be told from {' or '.join(later)} by this run: their capacity intervals overlap "
                "(rank them on a quieter machine)"
            )
    return lines


def table(results: dict[str, dict]) -> str:
    """The capacity table: images/s and emulated devices per path."""
    from tabulate import tabulate

    rows = []
    for path, r in results.items():
        c = r.get("capacity")
        if not c:
            continue
        if path == BASELINE:
            rows.append(
                [path, rate_text(c["images_per_sec"]), _interval_text(c), f"{c['devices']:.2f}", "baseline", "-"]
            )
            continue
        lo, hi = c["bracket_per_device"]
        cap = "< lowest probe" if c["images_per_sec"] is None else rate_text(c["images_per_sec"])
        if hi is None and c["images_per_sec"] is not None:
            cap = ">= " + cap
        tries = c.get("tries") or {}
        ok, n_ok = tries.get("kept_up_at_bracket_low") or (0, 0)
        kept_hi, n_hi = tries.get("kept_up_at_bracket_high") or (0, 0)
        bracket = _bracket(lo, hi)
        if n_ok or n_hi:  # how many tries agreed at each end
            bracket += f" (ok {ok}/{n_ok}, short {n_hi - kept_hi}/{n_hi})"
        rows.append([path, cap, _interval_text(c), f"{c['devices']:.2f}", str(len(c["probes"])), bracket])
    device = next((r["capacity"]["device"] for r in results.values() if r.get("capacity")), "?")
    text = tabulate(
        rows,
        headers=["input path", "capacity img/s", "interval", f"emulated {device}s", "probes", "bracket per device"],
        disable_numparse=True,
    )
    ranking = ranking_line(results)
    return "\n".join([text, *([ranking] if ranking else []), *overlap_lines(results), *failed_lines(results)])


def failed_lines(results: dict[str, dict]) -> list[str]:
    """One line per path whose probes failed (twice): no capacity for it, the others are kept."""
    failed = ((results.get(BASELINE) or {}).get("capacity") or {}).get("failed") or {}
    return [f"{p}: no capacity, its probe failed twice: {why.removeprefix(f'{p}: ')}" for p, why in failed.items()]


def _bracket(lo: float | None, hi: float | None) -> str:
    """`3,430.2 ok / 3,430.9 short`: the two ends, never printed alike."""
    a, b = _distinct(lo, hi) if lo is not None and hi is not None else (None, None)
    a = a or ("-" if lo is None else rate_text(lo))
    b = b or ("-" if hi is None else rate_text(hi))
    return f"{a} ok / {b} short"
