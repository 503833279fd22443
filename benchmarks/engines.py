"""`python -m benchmarks.engines DIR/results.json`: input paths side by side from a sweep's results.

For the engines compared with the ZMQ producers (docs/engines.md): each
path's ratio to the baseline, the CPU its input used per image (the
producers' or the engine's processes, and the trainer's receive threads,
as either trainer measured them: profiler/cpu.py `result_input_cores`),
the time to its first batch and the bytes each image took on the wire
(per message, so a batch's header counts; the tf.data service's are its payload),
read from a `bench_input.py --sweep --out DIR` run's results.json.
"""

from __future__ import annotations

import argparse
import json
import sys

from tabulate import tabulate

from core.registry import BASELINE
from profiler.cpu import result_input_cores


def rows(document: dict) -> list[list]:
    """One row per path of each grid point: path, images/s, ratio, input CPU ms per image, first batch, bytes."""
    out = []
    for run in document["runs"]:
        paths, batch = run["paths"], run["config"]["batch"]
        base = paths.get(BASELINE, {}).get("images_per_sec", {}).get("median")
        for name, r in paths.items():
            ips = (r.get("images_per_sec") or {}).get("median")
            tele = r.get("telemetry") or {}
            cores = result_input_cores(r)
            wire = tele.get("wire") or {}
            out.append(
                [
                    name,
                    _num(ips, ".0f"),
                    "baseline" if name == BASELINE else _num(ips / base if ips and base else None, ".2f"),
                    _num(1e3 * cores / ips if cores is not None and ips else None, ".3f"),
                    _num((r.get("first_batch") or {}).get("seconds"), ".1f"),
                    _num(_per_image(wire, batch), ",.0f"),
                ]
            )
    return out


def _per_image(wire: dict, batch: int) -> float | None:
    """Bytes each image took on the wire: bytes per message over images per message."""
    if not wire.get("messages_per_sec"):
        return None
    return wire["bytes_per_sec"] / wire["messages_per_sec"] / batch


def _num(value: float | None, spec: str) -> str:
    return "not measured" if value is None else format(value, spec)


HEADERS = ["input path", "images/s", "vs baseline", "input CPU ms/image", "first batch s", "wire bytes/image"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engines", description=__doc__)
    p.add_argument("results", help="a sweep's results.json (bench_input.py --sweep --out DIR)")
    args = p.parse_args(argv)
    try:
        with open(args.results) as f:
            document = json.load(f)
        table = rows(document)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {args.results}: not a sweep's results.json ({e})", file=sys.stderr)
        return 2
    print(tabulate(table, HEADERS, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
