"""The sweep's picture: images/s per input path grouped by device count, and scaling efficiency.

One row per (batch, precision, XLA) variant. Left: a bar per input path
inside each device-count group, the baseline hatched and drawn as a dashed
line across its group, each bar with the interval of its median
(profiler/uncertainty.py) as an error bar and labelled with its ratio to the
baseline and that ratio's interval; a bar whose ratio is within noise of the
baseline is cross-hatched and labelled "≈ baseline". Right, only when some
variant ran with one device and more: scaling efficiency against one device
(images/s with n devices over n times images/s with one), 100% dashed; when
it cannot be drawn, a caption under the figure says why instead of an empty
pane. The legend sits under the plots, never over a bar or its label.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from core.registry import BASELINE  # noqa: E402

WIDTH_IN, ROW_IN, DPI = 13.0, 4.5, 100
LEGEND_IN = 0.9  # under the plots: the legend and the caption
NOISE_HATCH = "xx"


def _variants(rows: list[dict]) -> list[tuple]:
    return sorted({(r["batch"], r["use_fp16"], r["use_xla_compile"]) for r in rows})


def _order(paths: set[str], path_order: list[str]) -> list[str]:
    known = [p for p in path_order if p in paths]
    return known + sorted(paths - set(known))


def _can_scale(rows: list[dict]) -> bool:
    devices = {r["num_gpus"] for r in rows}
    return len(devices) >= 2 and 1 in devices


def _interval(r: dict) -> tuple[float, float]:
    """The median's interval, or min–max for rows written before intervals were kept."""
    lo = r.get("images_per_sec_lo")
    hi = r.get("images_per_sec_hi")
    return (r["images_per_sec_min"], r["images_per_sec_max"]) if lo is None or hi is None else (lo, hi)


def plot_png(
    rows: list[dict], title: str = "", path_order: list[str] | None = None, shared_cores: int | None = None
) -> bytes:
    """The figure as PNG bytes (the caller writes it atomically).

    `shared_cores`: the towers were CPU devices sharing this many cores (no GPU): their scaling is the cores'.
    """
    variants = _variants(rows)
    scaling = _can_scale(rows)
    fig, axes = plt.subplots(
        len(variants), 2 if scaling else 1, figsize=(WIDTH_IN, ROW_IN * len(variants) + LEGEND_IN), dpi=DPI,
        squeeze=False, gridspec_kw={"width_ratios": [2.2, 1]} if scaling else None, layout="constrained",
    )  # fmt: skip
    path_order = path_order or list(dict.fromkeys(r["path"] for r in rows))
    # Colours by the registry's order, so a path keeps its colour from one plot to the next.
    colors = {
        p: plt.get_cmap("tab10")(i)
        for i, p in enumerate([*path_order, *sorted({r["path"] for r in rows} - set(path_order))])
    }
    for row_axes, (batch, fp16, xla) in zip(axes, variants):
        sub = [r for r in rows if (r["batch"], r["use_fp16"], r["use_xla_compile"]) == (batch, fp16, xla)]
        paths = _order({r["path"] for r in sub}, path_order)
        _throughput(
            row_axes[0], sub, paths, colors,
            f"batch {batch}/device, {'fp16' if fp16 else 'fp32'}, XLA {'on' if xla else 'off'}",
        )  # fmt: skip
        if scaling:
            _scaling(row_axes[1], sub, paths, colors)
    paths = _order({r["path"] for r in rows}, path_order)
    handles = [
        Patch(facecolor=colors[p], edgecolor="black", hatch="//" if p == BASELINE else None,
              label=f"{p} (baseline)" if p == BASELINE else p)
        for p in paths
    ]  # fmt: skip
    if any(r.get("within_noise") for r in rows):
        handles.append(
            Patch(facecolor="white", edgecolor="black", hatch=NOISE_HATCH, label="≈ baseline (within noise)")
        )
    # Under the plots (never over a bar), the caption as its title: one artist the layout keeps clear of the rest.
    legend = fig.legend(
        handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=9, frameon=False,
        title=_caption(rows, scaling, shared_cores) or None, title_fontsize=8,
    )  # fmt: skip
    legend.get_title().set_color("dimgray")
    if title:
        fig.suptitle(title, fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _caption(rows: list[dict], scaling: bool, shared_cores: int | None = None) -> str:
    windows = sorted({r["windows"] for r in rows if r.get("windows")})
    words = []
    if windows:
        n = str(windows[0]) if len(windows) == 1 else f"{windows[0]}–{windows[-1]}"
        words.append(f"error bars: interval of the median over {n} timed windows (order statistics)")
    if not scaling:
        devices = sorted({r["num_gpus"] for r in rows})
        n = ", ".join(str(d) for d in devices)
        words.append(
            f"scaling efficiency not drawn: every point ran on {n} device(s); a sweep with --num-gpus 1,2 draws it"
        )
    elif shared_cores and any(not str(r.get("model") or "").startswith("emulated") for r in rows):
        words.append(
            f"scaling efficiency of CPU towers sharing this machine's {shared_cores} cores: it shows the cores, "
            "not the input path"
        )
    return "; ".join(words)


def _throughput(ax, sub: list[dict], paths: list[str], colors: dict, variant: str) -> None:
    """Bars of images/s per path, grouped by device count, with intervals and the ratio to the baseline."""
    devices = sorted({r["num_gpus"] for r in sub})
    width = 0.8 / len(paths)
    top = max(max(_interval(r)[1], r["images_per_sec"]) for r in sub)
    crowded = len(paths) * len(devices) > 6  # narrow bars: shorter labels in a smaller font
    for gi, n in enumerate(devices):
        for pi, path in enumerate(paths):
            r = next((r for r in sub if r["num_gpus"] == n and r["path"] == path), None)
            if r is None:
                continue
            x = gi + (pi - (len(paths) - 1) / 2) * width
            is_base = path == BASELINE
            noise = bool(r.get("within_noise")) and not is_base
            lo, hi = _interval(r)
            ips = r["images_per_sec"]
            ax.bar(
                x, ips, width * 0.92, color=colors.get(path, "grey"), alpha=0.45 if noise else 1.0,
                hatch="//" if is_base else NOISE_HATCH if noise else None, edgecolor="black", linewidth=0.6,
                yerr=[[max(0.0, ips - lo)], [max(0.0, hi - ips)]], capsize=3, ecolor="black",
            )  # fmt: skip
            ax.text(
                x, max(hi, ips) + top * 0.02, _bar_label(r, is_base, noise, crowded), ha="center", va="bottom",
                fontsize=7 if crowded else 8, fontweight="bold" if noise else None, zorder=5,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85},
            )  # fmt: skip
            if is_base:
                ax.hlines(ips, gi - 0.42, gi + 0.42, colors="black", linestyles="dashed", lw=1)
    ax.set_xticks(range(len(devices)))
    ax.set_xticklabels([f"{n} device{'s' if n > 1 else ''}" for n in devices])
    ax.set_ylabel("images/s (median and its interval)")
    ax.set_ylim(0, top * 1.25)
    ax.set_title(
        f"Throughput by input path — {variant}\n(labels: ratio to the on-device baseline, with its interval; "
        "dashed line: baseline)",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)


def _bar_label(r: dict, is_base: bool, noise: bool, crowded: bool = False) -> str:
    if is_base:
        return "baseline"
    ratio = r.get("ratio_to_baseline")
    if ratio is None:
        return ""
    text = f"{ratio:.2f}×"
    if r.get("ratio_lo") is not None:
        interval = f"{r['ratio_lo']:.2f}–{r['ratio_hi']:.2f}"
        text += f"\n{interval}" if crowded else f"\n({interval})"
    if noise:
        return f"≈ {text}" if crowded else f"≈ baseline\n{text}"
    return text


def _scaling(ax2, sub: list[dict], paths: list[str], colors: dict) -> None:
    """Scaling efficiency against one device, per path (needs runs with 1 and more devices)."""
    devices = sorted({r["num_gpus"] for r in sub})
    ax2.set_title("Scaling efficiency vs one device", fontsize=10)
    if len(devices) < 2 or 1 not in devices:
        ax2.text(0.5, 0.5, "this variant ran on one device count only", ha="center", va="center", fontsize=9)
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


def capacity_png(results: dict[str, dict], title: str = "") -> bytes:
    """The capacity chart: per input path, the highest demand it sustains, in images/s and in devices.

    One horizontal bar per path (the baseline hatched: what the emulated devices
    themselves reach), labelled "N.NN <device>s" and its interval; the interval
    (profiler/capacity.py) is drawn as an error bar, an arrow where it is open
    above; dotted lines mark whole devices; each probe of the search is a dot on
    its path's row, filled where the path kept up (>= 97% of the baseline) and
    hollow where it fell short, repeated tries stacked a little apart so every
    one shows. Paths whose intervals overlap are named under the chart.
    """
    rows = [(p, r["capacity"]) for p, r in results.items() if r.get("capacity")]  # in the run's order
    device = rows[0][1]["device"] if rows else "device"
    per_device = rows[0][1]["device_images_per_sec"] if rows else 1.0
    overlaps = _overlap_words(rows)
    fig, ax = plt.subplots(
        figsize=(WIDTH_IN, 1.2 + 0.75 * max(1, len(rows)) + 0.25 * len(overlaps)), dpi=DPI, layout="constrained"
    )
    colors = {p: plt.get_cmap("tab10")(i) for i, p in enumerate(results)}
    top = _capacity_top(rows)
    for y, (path, c) in enumerate(rows):
        _capacity_row(ax, y, path, c, top, colors.get(path, "grey"), device)
    _device_lines(ax, per_device, top, device)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([p for p, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.3 if top else 1)
    ax.set_ylim(len(rows) - 0.4, -1.0)
    xlabel = "demand sustained at >= 97% of the baseline (images/s); error bars: the capacity's interval"
    ax.set_xlabel("\n".join([xlabel, *overlaps]))
    ax.set_title(
        title
        or f"Capacity per input path against emulated {device}s ({per_device:,.0f} img/s each)"
        "\n(dots: probes of the search — filled kept up, hollow fell short; repeated tries stacked)",
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _capacity_top(rows: list[tuple[str, dict]]) -> float:
    """The largest figure any row draws (capacity, interval's top, a probe): the chart's scale."""
    top = 0.0
    for c in (c for _, c in rows):
        iv = c.get("interval") or [None, None]
        top = max(
            [
                top,
                c.get("images_per_sec") or 0.0,
                iv[1] or 0.0,
                *(p["demand_images_per_sec"] for p in c.get("probes", [])),
            ]
        )
    return top


def _capacity_row(ax, y: int, path: str, c: dict, top: float, color, device: str) -> None:
    """One path's row: its capacity bar, the interval's error bar (an arrow where open), its probes, its label."""
    cap = c.get("images_per_sec") or 0.0
    probes = c.get("probes", [])
    ax.barh(
        y, cap, 0.6, color=color, edgecolor="black", linewidth=0.6,
        hatch="//" if path == BASELINE else None, alpha=0.85,
    )  # fmt: skip
    lo, hi = (c.get("interval") or [None, None])[:2]
    if lo is not None:
        right = hi if hi is not None else top * 1.12
        ax.errorbar(
            (lo + right) / 2, y, xerr=[[(right - lo) / 2], [(right - lo) / 2]], fmt="none", ecolor="black",
            capsize=4, lw=1.2, zorder=4,
        )  # fmt: skip
        if hi is None:  # open above: no probe fell short
            ax.annotate("", (top * 1.16, y), (right, y), arrowprops={"arrowstyle": "->", "lw": 1.2})
    seen: dict[float, int] = {}
    for p in probes:
        k = seen[p["demand_images_per_sec"]] = seen.get(p["demand_images_per_sec"], -1) + 1
        ax.plot(
            p["demand_images_per_sec"], y - 0.13 * k, marker="o", markersize=6, linestyle="none", zorder=5,
            markerfacecolor="black" if p["kept_up"] else "white", markeredgecolor="black",
        )  # fmt: skip
    words = "baseline" if path == BASELINE else ""
    label = f"{cap:,.0f} img/s = {c.get('devices', 0):.2f} {device}s"
    if lo is not None:
        label += f" (interval {lo:,.0f}–{hi:,.0f})" if hi is not None else f" (interval >= {lo:,.0f})"
    label += f" ({words})" if words else ""
    if path != BASELINE and c.get("images_per_sec") is None:
        label = "short even at the lowest probe"
    ax.text(cap + top * 0.01, y + 0.36, label, va="center", fontsize=9)


def _device_lines(ax, per_device: float, top: float, device: str) -> None:
    """Dotted lines at whole devices, thinned out when there are many."""
    n = 1
    while per_device * n <= top * 1.05:
        ax.axvline(per_device * n, color="grey", linestyle="dotted", lw=1)
        ax.text(per_device * n, -0.75, f"{n} {device}", ha="center", fontsize=8, color="grey")
        n += 1 if top / per_device < 12 else max(1, int(top / per_device / 8))


def _overlap_words(rows: list[tuple[str, dict]]) -> list[str]:
    """`python-queue and python-dataset cannot be told apart (capacity intervals overlap)`, once per pair."""
    out, seen = [], set()
    for path, c in rows:
        for other in c.get("cannot_tell_from") or []:
            pair = tuple(sorted((path, other)))
            if pair not in seen:
                seen.add(pair)
                out.append(f"{path} and {other} cannot be told apart by this run (their intervals overlap)")
    return out
