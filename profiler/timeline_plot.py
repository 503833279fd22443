"""timeline.png: the run's timeline (profiler/timeline.py) drawn as one row per stage.

Columns: images/s (the trainer's delivered rate, the producers' sent rate,
the loader's images), CPU cores and resident memory, and queue occupancy
when a path reported one. Every pane shades the timed windows, so a dip, a
CPU peak or a growing memory can be read against what was measured.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = (
    ("images_per_sec", "images/s (producers: sent)"),
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
COL_IN, ROW_IN, DPI = 4.2, 2.4, 100


def _columns(doc: dict) -> list[tuple[str, str]]:
    """The figures some stage has, in COLUMNS' order."""
    have = {k for r in doc["samples"] for s in r["stages"].values() for k in s}
    have |= (
        {"images_per_sec"}
        if any("sent_images_per_sec" in s for r in doc["samples"] for s in r["stages"].values())
        else set()
    )
    return [c for c in COLUMNS if c[0] in have]


def _series(doc: dict, stage: str, key: str) -> tuple[list[float], list[float]]:
    if key == "images_per_sec" and stage == "producers":
        key = "sent_images_per_sec"  # what the producers say they sent
    pts = [(r["t"], r["stages"][stage][key]) for r in doc["samples"] if key in r["stages"].get(stage, {})]
    return [t for t, _ in pts], [v for _, v in pts]


def timeline_png(doc: dict, title: str = "") -> bytes:
    """The figure as PNG bytes (the caller writes it atomically)."""
    stages, cols = doc["stages"], _columns(doc)
    fig, axes = plt.subplots(
        len(stages), len(cols), figsize=(COL_IN * len(cols), ROW_IN * len(stages) + 0.6), dpi=DPI,
        squeeze=False, sharex=True,
    )  # fmt: skip
    end = max([r["t"] for r in doc["samples"]] + [w["end"] for w in doc["windows"]] + [1.0])
    for i, stage in enumerate(stages):
        for j, (key, words) in enumerate(cols):
            ax = axes[i][j]
            _shade(ax, doc["windows"], labelled=i == 0 and j == 0)
            xs, ys = _series(doc, stage, key)
            if xs:
                # A rate or CPU figure covers the second before its sample; memory is read at the sample.
                step = "default" if key == "rss_mb" else "steps-pre"
                if step != "default":  # the first sample covers the run's first second
                    xs, ys = [0.0, *xs], [ys[0], *ys]
                ax.plot(xs, ys, ".-", color=f"C{j}", linewidth=1.2, markersize=3, drawstyle=step)
                ax.set_ylim(0, max(ys) * 1.12 or 1.0)  # a flat line stays clear of the frame
            else:
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="grey")
            ax.set_xlim(0, end)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(words)
            if j == 0:
                ax.set_ylabel(stage, fontweight="bold")
            if i == len(stages) - 1:
                ax.set_xlabel("seconds since the run started")
    if doc["windows"]:
        fig.legend(loc="lower center", ncol=1, frameon=False)
    fig.suptitle(title or "timeline: one row per stage, sampled once a second; timed windows shaded")
    fig.tight_layout(rect=(0, 0.04 if doc["windows"] else 0, 1, 0.97))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _shade(ax, windows: list[dict], labelled: bool) -> None:
    """Each timed window as a band, its label (the path, or the loader's worker count) once per label."""
    seen: set[str] = set()
    for w in windows:
        ax.axvspan(w["start"], w["end"], color=WINDOW_COLOR, alpha=0.35, linewidth=0,
                   label="timed windows" if labelled and not seen else None)  # fmt: skip
        if w["label"] not in seen and labelled:
            ax.annotate(w["label"], (w["start"], 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                        rotation=90, va="top", ha="right", color="#8a6d00")  # fmt: skip
        seen.add(w["label"])
