"""What `--loader-only` reports: rate per worker count, scaling, the cores a demand needs, and stage shares.

The cores needed for a demand (N emulated devices of a preset, or a rate)
are extrapolated from the largest measured point: images per CPU-second of
the loader's processes there, assumed to hold beyond it. Every line that
rests on that assumption says "extrapolated", and says the machine's own
cores: more workers than cores cannot speed up a CPU-bound loader.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import asdict, dataclass

from tabulate import tabulate

from core.atomic import atomic_write, write_all
from profiler.earlier import write_keeping_earlier


@dataclass(frozen=True)
class Demand:
    """What the loader should feed: `devices` devices at `images_per_sec` each."""

    device: str
    images_per_sec: float  # per device
    devices: int
    source: str

    @property
    def total(self) -> float:
        return self.images_per_sec * self.devices


def demand_words(d: dict) -> str:
    """A demand as the tables say it: `8 x H100 at 7000 img/s = 56000 img/s`, or the target rate."""
    if d["device"] == "target":
        return f"{d['total_images_per_sec']:.0f} img/s ({d['source']})"
    return f"{d['devices']} x {d['device']} at {d['images_per_sec']:.0f} img/s = {d['total_images_per_sec']:.0f} img/s"


def cores_for(demand_total: float, point: dict | None, best: float | None, machine_cores: int) -> dict:
    """The cores `demand_total` images/s needs, one figure in one unit, extrapolated from `point`'s images per
    CPU-second (its `images_per_sec` over its `cpu_cores`), and whether that is more than this machine has:
    more workers than cores cannot speed up a CPU-bound loader. `best`: the best measured rate, which alone says
    "enough". `point` None: nothing was measured to extrapolate from, and said so. What --loader-only's
    `needs` and --tune's shortfall both say (profiler/tune_report.py)."""
    base = {"demand_images_per_sec": demand_total, "extrapolated": point is not None, "machine_cores": machine_cores}
    if point is None or best is None:
        return {
            **base, "extrapolated": False, "measured_best_images_per_sec": None, "enough_as_measured": False,
            "cores_needed": None, "images_per_sec_per_core": None, "beyond_this_machine": None,
            "not_measured": "no point timed the batches a rate needs",
        }  # fmt: skip
    per_core = point["images_per_sec"] / point["cpu_cores"] if point["cpu_cores"] > 0 else None
    cores = math.ceil(demand_total / per_core) if per_core else None
    return {
        **base,
        "measured_best_images_per_sec": best,
        "enough_as_measured": best >= demand_total,
        "cores_needed": cores,
        "images_per_sec_per_core": per_core,
        "beyond_this_machine": cores is not None and cores > machine_cores,
        "not_measured": None,
    }


def needs(rows: list[dict], demand: Demand, machine_cores: int) -> dict:
    """The cores the demand needs (`cores_for`), extrapolated from the largest measured point. "Enough" only
    from a measured rate."""
    measured = [r for r in rows if r["images_per_sec"] is not None]
    top = max(measured, key=lambda r: r["workers"]) if measured else None
    best = max((r["images_per_sec"] for r in measured), default=None)
    return {**cores_for(demand.total, top, best, machine_cores), "extrapolated_from_workers": top and top["workers"]}


def cores_words(n: dict, words: str, measured_with: str) -> str:
    """`to feed WORDS: about N cores (extrapolated from R img/s per core, measured with ...; measured best B
    img/s); this machine has C[: more workers than cores cannot ...]`: the cores part of `cores_for`."""
    best = f"measured best {n['measured_best_images_per_sec']:.0f} img/s"
    if n["cores_needed"] is None:
        return f"to feed {words}: {best}; its processes' CPU time was not measured: no cores to extrapolate to"
    head = (
        f"to feed {words}: about {n['cores_needed']:,} cores (extrapolated from {n['images_per_sec_per_core']:.3g} "
        f"img/s per core, measured with {measured_with}; {best})"
    )
    if n["beyond_this_machine"]:
        return (
            f"{head}; this machine has {n['machine_cores']}: more workers than cores cannot speed up a CPU-bound "
            "loader; speed up its slowest stage, or spread it over machines with that many cores"
        )
    return f"{head}; this machine has {n['machine_cores']}"


def needs_words(n: dict, words: str) -> str:
    """What the demand needs, in cores, with the per-core rate it extrapolates from and this machine's cores."""
    if n["not_measured"]:
        return f"cannot say whether it feeds {words}: {n['not_measured']} (a longer --loader-seconds)"
    if n["enough_as_measured"]:
        return f"feeds {words}: measured {n['measured_best_images_per_sec']:.0f} img/s"
    return cores_words(n, words, f"{n['extrapolated_from_workers']} worker(s)")


def document(name: str, rows: list[dict], demand: Demand | None, stages: dict | None, machine_cores: int) -> dict:
    """The JSON of a --loader-only run."""
    return {
        "loader": name,
        "mode": "loader-only",
        "machine_cores": machine_cores,
        "points": rows,
        "demand": {**asdict(demand), "total_images_per_sec": demand.total} if demand else None,
        "needs": needs(rows, demand, machine_cores) if demand else None,
        "stages": stages,
    }


def text(doc: dict) -> str:
    """The table of points, the demand's needs, and the stage table."""
    rows = [
        [r["workers"], r["not_measured"], "", "", f"{r['cpu_cores']:.2f}"]
        if r["images_per_sec"] is None
        else [
            r["workers"],
            f"{r['images_per_sec']:.1f}",
            f"{r['images_per_sec_per_worker']:.1f}",
            "" if r["scaling_efficiency"] is None else f"{100 * r['scaling_efficiency']:.0f}%",
            f"{r['cpu_cores']:.2f}",
        ]
        for r in doc["points"]
    ]
    out = [
        f"loader {doc['loader']} alone, no trainer ({doc['machine_cores']} cores here)",
        tabulate(
            rows,
            headers=["workers", "images/s", "images/s per worker", "scaling efficiency", "CPU cores used"],
            disable_numparse=True,
        ),
    ]
    dup = doc.get("duplicates")
    given = "the loader as given" + (f" (num_workers={dup['num_workers']})" if (dup or {}).get("num_workers") else "")
    if words := duplicates_words(dup, given):
        out.append(words)
    d, n = doc.get("demand"), doc.get("needs")
    if d and n:
        out += ["", needs_words(n, demand_words(d))]
    st = doc.get("stages")
    if st:
        out += ["", stages_text(st)]
    return "\n".join(out)


def duplicates_words(dup: dict | None, what: str) -> str | None:
    """The line that says a setting yields each sample more than once per epoch (or could not be checked for it);
    None when it does not (core/loader_duplicates.py `duplicates`)."""
    if dup is None:
        return None
    if not dup["checked"]:
        return (
            f"{what}: not checked for samples repeated by its workers ({dup['why']}); a DataLoader over "
            "an IterableDataset repeats every sample in each worker unless its __iter__ splits them "
            "(torch.utils.data.get_worker_info)"
        )
    return (
        f"warning: {what}: an epoch yields {dup['samples_per_epoch']:,} samples where one process yields "
        f"{dup['single_process']:,}: the IterableDataset is not split between the DataLoader's workers, so each "
        f"sample comes about {dup['samples_per_epoch'] / dup['single_process']:.3g} times and the images/s count "
        "the copies; split it in __iter__ (torch.utils.data.get_worker_info) before using this setting"
    )


def stages_text(st: dict) -> str:
    """Per-stage time per sample and its share of the whole; or the note saying why there is none."""
    if not st.get("stages"):
        return f"stages: {st.get('note', 'not measured')}"
    rows = [[s["name"], f"{1e3 * s['seconds_per_sample']:.2f}", f"{100 * s['share']:.1f}%"] for s in st["stages"]]
    rows.append(["(whole sample)", f"{1e3 * st['seconds_per_sample']:.2f}", f"{100 * st['shares_sum']:.1f}%"])
    head = f"where a sample's time goes ({st['samples']} samples, {st['source']}):"
    table = tabulate(rows, headers=["stage", "ms per sample", "share"], disable_numparse=True)
    slowest = f"slowest stage: {st['slowest']}"
    return "\n".join(x for x in (head, table, slowest, st.get("note")) if x)


def write_json(path: str, doc: dict) -> None:
    atomic_write(path, json.dumps(doc, indent=2))


def write_files(out: str, doc: dict, extra: dict[str, str | bytes] | None = None) -> list[str]:
    """loader.json and loader.png (and `extra`: the timeline) in `out`, all or none; an earlier set there is
    kept (profiler/earlier.py)."""
    os.makedirs(out, exist_ok=True)
    files = {"loader.json": json.dumps(doc, indent=2), "loader.png": plot_png(doc), **(extra or {})}
    return write_keeping_earlier(
        out,
        list(files),
        lambda: write_all({os.path.join(out, n): data for n, data in files.items()}, what=f"--out {out}"),
    )


def plot_png(doc: dict) -> bytes:
    """Images/s against workers, the demand as a horizontal line (and its extrapolated worker count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in doc["points"] if r["images_per_sec"] is not None]  # a point not measured is not drawn
    xs, ys = [r["workers"] for r in pts], [r["images_per_sec"] for r in pts]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    ax.plot(xs, ys, "o-", label="measured")
    if pts:
        one = pts[0]["images_per_sec"] / pts[0]["workers"]
        ax.plot(xs, [one * x for x in xs], ":", color="grey", label="linear from 1 worker")
    else:
        ax.text(0.5, 0.5, "no point measured: too few batches", ha="center", transform=ax.transAxes)
    d, n = doc.get("demand"), doc.get("needs")
    if d and n:
        ax.axhline(d["total_images_per_sec"], color="red", linestyle="--",
                   label=f"demand: {demand_words(d)}")  # fmt: skip
        if xs and n["cores_needed"] and not n["enough_as_measured"]:
            ax.annotate(
                f"needs ~{n['cores_needed']:,} cores (extrapolated; {n['machine_cores']} here)",
                xy=(max(xs), ys[-1]), xytext=(0.35, 0.85), textcoords="axes fraction",
            )  # fmt: skip
    ax.set_xlabel("loader workers (processes)")
    ax.set_ylabel("images/s")
    ax.set_title(f"loader {doc['loader']} alone")
    ax.set_xticks([r["workers"] for r in doc["points"]])
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
