"""The sweep's picture: images/s per input path grouped by device count, and scaling efficiency.

One row of two panels per (batch, precision, XLA) variant. Left: a bar per
input path inside each device-count group, the baseline hatched and drawn
as a dashed line across its group, each bar labelled with its ratio to the
baseline. Right: scaling efficiency against one device (images/s with n
devices over n times images/s with one), 100% dashed.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from core.registry import BASELINE  # noqa: E402

WIDTH_IN, ROW_IN, DPI = 13.0, 4.5, 100


def _variants(rows: list[dict]) -> list[tuple]:
    return sorted({(r["batch"], r["use_fp16"], r["use_xla_compile"]) for r in rows})


def _order(paths: set[str], path_order: list[str]) -> list[str]:
    known = [p for p in path_order if p in paths]
    return known + sorted(paths - set(known))


def plot_png(rows: list[dict], title: str = "", path_order: list[str] | None = None) -> bytes:
    """The figure as PNG bytes (the caller writes it atomically)."""
    variants = _variants(rows)
    fig, axes = plt.subplots(
        len(variants), 2, figsize=(WIDTH_IN, ROW_IN * len(variants)), dpi=DPI, squeeze=False,
        gridspec_kw={"width_ratios": [2.2, 1]},
    )  # fmt: skip
    path_order = path_order or list(dict.fromkeys(r["path"] for r in rows))
    # Colours by the registry's order, so a path keeps its colour from one plot to the next.
    colors = {
        p: plt.get_cmap("tab10")(i)
        for i, p in enumerate([*path_order, *sorted({r["path"] for r in rows} - set(path_order))])
    }
    for (ax, ax2), (batch, fp16, xla) in zip(axes, variants):
        sub = [r for r in rows if (r["batch"], r["use_fp16"], r["use_xla_compile"]) == (batch, fp16, xla)]
        paths = _order({r["path"] for r in sub}, path_order)
        _throughput(
            ax, sub, paths, colors, f"batch {batch}/device, {'fp16' if fp16 else 'fp32'}, XLA {'on' if xla else 'off'}"
        )
        _scaling(ax2, sub, paths, colors)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _throughput(ax, sub: list[dict], paths: list[str], colors: dict, variant: str) -> None:
    """Bars of images/s per path, grouped by device count, with min–max and the ratio to the baseline."""
    devices = sorted({r["num_gpus"] for r in sub})
    width = 0.8 / len(paths)
    top = max(r["images_per_sec_max"] for r in sub)
    for gi, n in enumerate(devices):
        for pi, path in enumerate(paths):
            r = next((r for r in sub if r["num_gpus"] == n and r["path"] == path), None)
            if r is None:
                continue
            x = gi + (pi - (len(paths) - 1) / 2) * width
            is_base = path == BASELINE
            ax.bar(
                x, r["images_per_sec"], width * 0.92, color=colors.get(path, "grey"),
                hatch="//" if is_base else None, edgecolor="black", linewidth=0.6,
                yerr=[[r["images_per_sec"] - r["images_per_sec_min"]], [r["images_per_sec_max"] - r["images_per_sec"]]],
                capsize=2, label=(f"{path} (baseline)" if is_base else path) if gi == 0 else None,
            )  # fmt: skip
            label = "baseline" if is_base else f"{r['ratio_to_baseline']:.2f}×" if r["ratio_to_baseline"] else ""
            ax.text(x, r["images_per_sec_max"] + top * 0.02, label, ha="center", va="bottom", fontsize=8)
            if is_base:
                ax.hlines(r["images_per_sec"], gi - 0.42, gi + 0.42, colors="black", linestyles="dashed", lw=1)
    ax.set_xticks(range(len(devices)))
    ax.set_xticklabels([f"{n} device{'s' if n > 1 else ''}" for n in devices])
    ax.set_ylabel("images/s (median, min–max)")
    ax.set_ylim(0, top * 1.18)
    ax.set_title(
        f"Throughput by input path — {variant}\n(labels: ratio to the on-device baseline; dashed line: baseline)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left", ncol=min(3, len(paths)))
    ax.grid(axis="y", alpha=0.3)


def _scaling(ax2, sub: list[dict], paths: list[str], colors: dict) -> None:
    """Scaling efficiency against one device, per path (needs runs with 1 and more devices)."""
    devices = sorted({r["num_gpus"] for r in sub})
    ax2.set_title("Scaling efficiency vs one device", fontsize=10)
    if len(devices) < 2 or 1 not in devices:
        ax2.text(0.5, 0.5, "needs runs with 1 and more devices\n(e.g. --num-gpus 1,2)", ha="center", va="center")
        ax2.set_axis_off()
        return
    for path in paths:
        pts = sorted(
            (r["num_gpus"], r["scaling_efficiency"])
            for r in sub
            if r["path"] == path and r["scaling_efficiency"] is not None
        )
        if pts:
            ax2.plot(
                [p[0] for p in pts], [100 * p[1] for p in pts], marker="o", color=colors.get(path, "grey"),
                linestyle="--" if path == BASELINE else "-", label=path,
            )  # fmt: skip
    ax2.axhline(100, color="black", linestyle="dashed", lw=1)
    ax2.set_xticks(devices)
    ax2.set_xlabel("devices")
    ax2.set_ylabel("% of linear scaling")
    effs = [100 * r["scaling_efficiency"] for r in sub if r["scaling_efficiency"] is not None]
    ax2.set_ylim(0, max(125, 1.1 * max(effs, default=0)))  # above 100%: a noisy 1-device point
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="lower left")
