"""timeline.png: the run's timeline (profiler/timeline.py) drawn as one row per stage.

Columns: images/s (the trainer's delivered rate, the producers' sent rate,
the loader's images), CPU cores (up to the machine's, drawn as a line) and
resident memory, and queue occupancy when a path reported one. Every pane
shades the timed windows, so a dip, a CPU peak or a growing memory can be
read against what was measured; a figure is drawn only where it was
measured (a second without the stage's processes, or a path without a
queue, is a gap). A new row of figures is a stage in the document's rows;
a new figure a COLUMNS entry, drawn by `_pane`.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = (
    ("images_per_sec", "images/s"),
    ("cpu_cores", "CPU cores"),
    ("rss_mb", "resident MB"),
    ("queue_occupancy", "queue occupancy"),
    # The GPUs' own state (profiler/gpu_state.py), in the `gpu` row, where NVML was read.
    ("sm_mhz", "SM clock (MHz)"),
    ("power_w", "power (W)"),
    ("temp_c", "temperature (C)"),
    ("util_pct", "GPU utilisation (%)"),
)
WINDOW_COLOR = "#f2c14e"
LABEL_COLOR = "#6b5200"
COL_IN, ROW_IN, DPI = 4.2, 2.4, 100
LABEL_PT = 9  # a path's label over its windows: readable at the PNG's 100 dpi
NAN = float("nan")
HEADROOM, HEADROOM_LABELLED = 1.12, 1.45  # the y axis's top over the highest figure; the top row holds the labels
CEILING_FROM = 0.5  # the machine's cores are drawn in a CPU pane whose figures reach this share of them


def _columns(doc: dict) -> list[tuple[str, str]]:
    """The figures some stage has, in COLUMNS' order; images/s says what the producers' row counts."""
    have = {k for r in doc["samples"] for s in r["stages"].values() for k in s}
    if any("sent_images_per_sec" in s for r in doc["samples"] for s in r["stages"].values()):
        have.add("images_per_sec")
    producers = "producers" in doc["stages"]
    words = {"images_per_sec": "images/s (producers: sent)"} if producers else {}
    return [(k, words.get(k, w)) for k, w in COLUMNS if k in have]


def _series(doc: dict, stage: str, key: str, stepped: bool) -> tuple[list[float], list[float]]:
    """The stage's figure over the run, broken (NaN) where it has none: a second without the stage's
    processes, or a path without a queue, is drawn as nothing, not as the neighbouring value.

    `stepped`: the figure covers the time since the row before (a rate, CPU), drawn from that row's time.
    """
    if key == "images_per_sec" and stage == "producers":
        key = "sent_images_per_sec"  # what the producers say they sent
    xs: list[float] = []
    ys: list[float] = []
    before, drawing = 0.0, False
    for r in doc["samples"]:
        s = r["stages"].get(stage, {})
        if key in s and s.get("processes", 1) > 0:
            if stepped and not drawing:
                xs.append(before), ys.append(s[key])
            xs.append(r["t"]), ys.append(s[key])
            drawing = True
        elif drawing:
            xs.append(NAN), ys.append(NAN)
            drawing = False
        before = r["t"]
    return xs, ys


def timeline_png(doc: dict, title: str = "") -> bytes:
    """The figure as PNG bytes (the caller writes it atomically)."""
    fig = timeline_figure(doc, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def timeline_figure(doc: dict, title: str = ""):
    """The matplotlib figure: a row per stage, a column per figure (COLUMNS)."""
    stages, cols = doc["stages"], _columns(doc)
    fig, axes = plt.subplots(
        len(stages), len(cols), figsize=(COL_IN * len(cols), ROW_IN * len(stages) + 0.6), dpi=DPI,
        squeeze=False, sharex=True,
    )  # fmt: skip
    end = max([r["t"] for r in doc["samples"]] + [w["end"] for w in doc["windows"]] + [1.0])
    for i, stage in enumerate(stages):
        for j, (key, words) in enumerate(cols):
            ax = axes[i][j]
            _shade(ax, doc["windows"], labelled=i == 0)
            _pane(ax, doc, stage, key, f"C{j}", HEADROOM_LABELLED if i == 0 and doc["windows"] else HEADROOM)
            ax.set_xlim(0, end)
            if i == 0:
                ax.set_title(words)
            if j == 0:
                ax.set_ylabel(stage, fontweight="bold")
            if i == len(stages) - 1:
                ax.set_xlabel("seconds since the run started")
    if doc["windows"]:
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles[:1], labels[:1], loc="lower center", ncol=1, frameon=False)
    fig.suptitle(title or "timeline: one row per stage, sampled once a second; timed windows shaded")
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, 0.3 / height if doc["windows"] else 0, 1, 1 - 0.25 / height))
    return fig


def _pane(ax, doc: dict, stage: str, key: str, color: str, headroom: float) -> None:
    """One stage's figure in one pane; CPU with the machine's cores as its ceiling."""
    stepped = key != "rss_mb"  # a rate or CPU covers the second before its sample; memory is read at it
    xs, ys = _series(doc, stage, key, stepped)
    ax.grid(alpha=0.3)
    values = [y for y in ys if y == y]
    if not values:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="grey")
        return
    ax.plot(xs, ys, ".-", color=color, linewidth=1.2, markersize=3, drawstyle="steps-pre" if stepped else "default")
    top = max(values) * headroom or 1.0  # a flat line stays clear of the frame (and of the labels over it)
    cores = doc.get("machine_cores")
    if key == "cpu_cores" and cores and max(values) > CEILING_FROM * cores:
        ax.axhline(cores, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"{cores} cores", (0.99, cores), xycoords=("axes fraction", "data"), ha="right", va="bottom",
                    fontsize=8, color="grey")  # fmt: skip
        top = max(top, cores * headroom)
    ax.set_ylim(0, top)


def _spans(windows: list[dict]) -> list[tuple[str, float, float]]:
    """(label, first window's start, last window's end) per label, in the order they ran."""
    out: dict[str, list[float]] = {}
    for w in windows:
        a, b = out.setdefault(w["label"], [w["start"], w["end"]])
        out[w["label"]] = [min(a, w["start"]), max(b, w["end"])]
    return [(k, a, b) for k, (a, b) in out.items()]


def _shade(ax, windows: list[dict], labelled: bool) -> None:
    """Each timed window as a band; over the top row, each label (the path, the loader's setting or epoch) once,
    level and at a readable size, every other one lower so that neighbours do not run into each other."""
    for k, w in enumerate(windows):
        ax.axvspan(w["start"], w["end"], color=WINDOW_COLOR, alpha=0.35, linewidth=0,
                   label="timed windows" if k == 0 else None)  # fmt: skip
    if not labelled:
        return
    for k, (label, a, b) in enumerate(_spans(windows)):
        ax.annotate(label, ((a + b) / 2, 0.97 if k % 2 == 0 else 0.84), xycoords=("data", "axes fraction"),
                    fontsize=LABEL_PT, ha="center", va="top", color=LABEL_COLOR,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.75, "linewidth": 0})  # fmt: skip
