"""`--real-data`: every way to feed the model from one JPEG folder, side by side, and the cores each would need.

Framework-neutral. Per path, from its result: the ratio to the on-device baseline and its interval, the
input wait, the input side's CPU cores (the processes the ranks started, producers or DataLoader workers,
and their input threads: profiler/cpu.py `input_cores`), images/s per input core, the time to the first
batch, and the decoder used. From images/s per input core, the cores the path would need to feed the
baseline's measured rate on this run's devices and on 8 such devices, in the words of a demand
(profiler/loader_report.py `Demand`: devices x images/s each), extrapolated and said so.
"""

from __future__ import annotations

import math

from tabulate import tabulate

from profiler.cpu import result_input_cores
from profiler.loader_report import Demand, demand_words
from profiler.training import invalid_reason

DEVICES = 8  # the larger demand: a full machine of the devices measured


def decoder_of(result: dict, loader: str | None = None) -> str:
    """Who decoded the JPEGs, in words: the path's decoder stage, its producers, or its loader."""
    if (result.get("input") or {}).get("name") == "loader" and loader:
        return f"loader {loader} in the rank's DataLoader workers"
    decoder = (result.get("telemetry") or {}).get("decoder") or {}
    where = sorted({d["on"] for d in result.get("decoded_on") or [] if d.get("on")})
    if decoder.get("kind"):
        return decoder["kind"] + (f" on {', '.join(where)}" if where else "")
    maker = (result.get("input") or {}).get("batch_maker") or {}
    words = maker.get("name") or maker.get("kind") or "none (made on the device)"
    return words + (f" on {', '.join(where)}" if where else "")


def demands(baseline: dict, devices: int) -> list[Demand]:
    """The baseline's measured rate on this run's devices, and on DEVICES such devices."""
    per_device = (baseline.get("images_per_sec_per_device") or {}).get("median") or 0.0
    source = "the on-device baseline of this run"
    return [Demand("measured device", per_device, n, source) for n in sorted({devices, DEVICES})]


NOT_TOLD_APART = 0.01  # input cores below this: the path's input runs on threads the meter cannot tell apart


CORE_BOUND = 0.7  # the input side busy on at least this share of the cores it was given: they are its limit


def feeding(result: dict, wanted: list[Demand], loader: str | None = None, given: int | None = None) -> dict:
    """A path's input side: its cores, images/s per core, and the cores each demand needs (extrapolated).

    Input cores too few to be the input's own (the baseline's, or DALI's or SPDL's threads inside the rank,
    which are not told apart from the trainer's) are None: not measured, and no cores-needed figure. Nor is
    there one where the input side used under CORE_BOUND of the `given` cores (its producers or DataLoader
    workers) while the path fell short: something else limits it (gpu-decode's decoding on the rank, on the
    H200 of 2026-11-28: 1.2 of 4 cores busy), and more cores would not feed a faster device.
    """
    cores = result_input_cores(result)
    cores = cores if cores is not None and cores >= NOT_TOLD_APART else None
    rate = (result.get("images_per_sec") or {}).get("median") or 0.0
    per_core = rate / cores if cores else None
    short = (result.get("ratio_to_baseline") or 1.0) < 0.95
    core_bound = None if cores is None or not given else cores >= CORE_BOUND * given or not short
    needs = []
    for d in wanted:
        words = {"device": d.device, "images_per_sec": d.images_per_sec, "devices": d.devices, "source": d.source}
        needed = math.ceil(d.total / per_core) if per_core and core_bound is not False else None
        needs.append({**words, "total_images_per_sec": d.total, "cores_needed": needed, "extrapolated": True})
    return {
        "input_cores": cores,
        "input_cores_given": given,
        "core_bound": core_bound,
        "images_per_sec_per_input_core": per_core,
        "decoder": decoder_of(result, loader),
        "needs": needs,
    }


def add_feeding(
    results: dict[str, dict], baseline: str, devices: int, loader: str | None = None, given: int | None = None
) -> None:
    """Each path's `feeding` block (the baseline's too: it decodes nothing and needs no input cores); `given`:
    the producers (and DataLoader workers) each path was given."""
    wanted = demands(results.get(baseline) or {}, devices)
    for name, r in results.items():
        if r.get("images_per_sec"):
            r["feeding"] = feeding(r, wanted, loader, None if name == baseline else given)


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def table(results: dict[str, dict]) -> str:
    """The real-data table: one row per path, then the cores each demand needs."""
    rows, needs_rows = [], []
    for name, r in results.items():
        f = r.get("feeding")
        if not f:
            continue
        if invalid_reason(r):  # a model that did not train gives no figure (profiler/training.py), here neither
            rows.append([name, "invalid", "—", "—", "—", "—", "—", f["decoder"]])
            needs_rows.append([name, *("—" for _ in f["needs"])])
            continue
        ratio = r.get("ratio_to_baseline")
        interval = (r.get("uncertainty") or {}).get("ratio")
        wait = (r.get("telemetry") or {}).get("input_wait_share")
        first = (r.get("first_batch") or {}).get("seconds")
        rows.append([
            name, _num(ratio), f"{interval[0]:.2f}–{interval[1]:.2f}" if interval else "—",
            _num(wait * 100 if wait is not None else None, "{:.0f}%"), _num(f["input_cores"]),
            _num(f["images_per_sec_per_input_core"], "{:,.0f}"), _num(first, "{:.2f} s"), f["decoder"],
        ])  # fmt: skip
        if f.get("core_bound") is False:  # its cores were not its limit: no cores-needed figure
            busy = f"not core-bound: {f['input_cores']:.1f} of {f['input_cores_given']} cores busy"
            needs_rows.append([name, *(busy for _ in f["needs"])])
        else:
            needs_rows.append([name, *(_num(n["cores_needed"], "{:,}") for n in f["needs"])])
    out = tabulate(
        rows,
        headers=[
            "input path",
            "vs baseline",
            "interval",
            "input wait",
            "input cores",
            "img/s per core",
            "first batch",
            "decoder",
        ],  # fmt: skip
    )
    first = next((r["feeding"]["needs"] for r in results.values() if r.get("feeding")), [])
    if first:
        heads = [f"cores for {demand_words(n)}" for n in first]
        out += "\n\n" + tabulate(needs_rows, headers=["input path", *heads])
        out += "\ncores needed: extrapolated from each path's measured images/s per input core, as if it held; "
        out += "—: input cores not measured (none, or threads inside the rank not told apart from the trainer's)"
    if any(invalid_reason(r) for r in results.values() if r.get("feeding")):
        out += "\ninvalid: the path's model did not train in this run (its verdict says why): no figure"
    return out


def text(results: dict[str, dict], baseline: str, cfg) -> str:
    """Each path's `feeding` block added to its result, and the table that shows them."""
    add_feeding(results, baseline, cfg.num_gpus, cfg.loader, cfg.producers)
    head = f"feeding the model from {cfg.data} (input cores: the processes the ranks started and their input threads)"
    return head + "\n" + table(results)
