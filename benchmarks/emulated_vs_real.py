"""`python -m benchmarks.emulated_vs_real REAL.json EMULATED.json [...]`: the emulated answer checked against a real device.

feedbench predicts, from an emulated device set to a real one's rate, whether an input path keeps that device
fed. Given the same paths run on the real device and on the emulated one (same files, batch and input cores:
scripts/gpu_torch_run.sh's real-data and emulated steps write such pairs), this prints, per path, both
images/s and both ratios to their own baselines, each with its interval, and whether the intervals overlap:
where they do not, the emulation left out something the device does (its copy, clocks, contention).
"""

from __future__ import annotations

import argparse
import json
import sys

from tabulate import tabulate

from profiler.training import invalid_reason


def _rate(r: dict) -> str:
    ips = r.get("images_per_sec") or {}
    return f"{ips.get('median', 0):,.0f} ({ips.get('min', 0):,.0f}–{ips.get('max', 0):,.0f})"


def _ratio(r: dict) -> tuple[str, tuple[float, float] | None]:
    ratio = r.get("ratio_to_baseline")
    interval = (r.get("uncertainty") or {}).get("ratio")
    if ratio is None:
        return "—", None
    words = f"{ratio:.2f}" + (f" ({interval[0]:.2f}–{interval[1]:.2f})" if interval else "")
    return words, tuple(interval) if interval else (ratio, ratio)


def rows(real: dict, emulated: dict) -> list[list[str]]:
    """One row per path the two runs share: rates, ratios with intervals, and whether the ratios agree."""
    out = []
    for name, r in real["paths"].items():
        e = emulated["paths"].get(name)
        if e is None:
            continue
        (rw, ri), (ew, ei) = _ratio(r), _ratio(e)
        why = invalid_reason(r) or invalid_reason(e)
        if why:
            verdict = f"not compared: {why}"
        elif ri is None or ei is None:
            verdict = "—"
        elif ri[0] <= ei[1] and ei[0] <= ri[1]:
            verdict = "agree (intervals overlap)"
        else:
            verdict = f"differ: the emulated ratio {e['ratio_to_baseline'] / r['ratio_to_baseline'] - 1:+.0%}"
        out.append([name, _rate(r), _rate(e), rw, ew, verdict])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.emulated_vs_real", description=__doc__)
    p.add_argument("files", nargs="+", help="REAL.json EMULATED.json, as many pairs as wanted")
    args = p.parse_args(argv)
    if len(args.files) % 2:
        p.error("give the result files in pairs: REAL.json EMULATED.json")
    for real_path, emulated_path in zip(args.files[::2], args.files[1::2]):
        try:
            real, emulated = (json.load(open(f)) for f in (real_path, emulated_path))
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        producers = real["config"].get("producers"), emulated["config"].get("producers")
        print(f"{real_path} against {emulated_path} (producers: {producers[0]} and {producers[1]})")
        heads = ["input path", "real images/s", "emulated images/s", "real ratio", "emulated ratio", "reading"]
        print(tabulate(rows(real, emulated), headers=heads) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
