"""Did a change make a run slower? Two result files compared path by path, beyond noise or not.

`python -m profiler.compare OLD.json NEW.json`, and `bench_input.py ... --compare OLD.json`, read two
results of single runs (`--json`, or `--out DIR`'s results.json; docs/results.md). For each path in both:

- images/s, OLD -> NEW, and the change NEW / OLD with an interval: the pairwise-ratio interval of NEW's
  windows against OLD's (profiler/uncertainty.py `ratio_interval`, Moses' interval on the logs), the same
  interval a path's ratio to the baseline gets within one run;
- its ratio to the baseline, OLD -> NEW, and that ratio's change with an interval made from the intervals
  each file already holds (`uncertainty.ratio`): [NEW low / OLD high, NEW high / OLD low]. It holds the true
  change whenever both hold their ratios, so its confidence is at least the sum of theirs less one. The
  ratio tells a change of the input (the ratio moved) from one of the machine or the trainer (the baseline
  moved as much);
- the verdict, from the images/s interval (what a user trains at): `slower beyond noise` when it lies wholly
  below 1.0, `faster beyond noise` wholly above, `within noise` when it holds 1.0; `noise unknown (one
  window)` when a file has a single window;
- the stage whose share of a step's time moved most (`step_shares`).

Exit status, for a CI job: 1 when some path is slower beyond noise, 0 otherwise, 2 for bad input (a file
that is missing, unreadable, no regular file or over 64 MiB, or no single run's result; a figure it reads that
is of the wrong type or not finite, named by its field; two results of different machines or configurations;
a result whose model did not train, marked invalid in its `training` block).

What must match (`MACHINE`, `CONFIGURATION`): the machine as the result records it, the trainer, the model,
the devices, the batch and images, and how the batches travel (producers, wire, transport, encryption).
Everything else may differ, because that is what a comparison is for: library versions (an upgrade), the
loader's own settings (`--loader`, `--producer-rate`, ...), how long the run measured (`--steps`,
`--repeats`), and the host name (a container or a CI runner gets a new one each run); they are listed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from tabulate import tabulate

from core.atomic import NotReadable, read_regular
from core.errors import FeedbenchError
from core.registry import BASELINE
from profiler.report import SCHEMA_VERSION
from profiler.summary import rate_figure
from profiler.training import invalid_reason, invalid_words
from profiler.uncertainty import NEGLIGIBLE, ratio_interval, window_rates

# Versions whose figures read alike: 3 renamed `input.feeder` to `input.batch_maker`, which no comparison reads.
READS = (2, SCHEMA_VERSION)
SLOWER = "slower beyond noise"
WITHIN = "within noise"
FASTER = "faster beyond noise"
UNKNOWN = "noise unknown (one window)"
# `device` fields: two results of different machines cannot be compared.
MACHINE = ("gpus", "cpu", "cpu_cores")
# `config` fields: the workload itself. `model` (the real or emulated device) and the framework come first.
CONFIGURATION = (
    "num_gpus", "nnodes", "batch", "image_size", "input_only", "use_fp16", "use_xla_compile", "variable_update",
    "ps_device", "resnet_version", "data_format", "producers", "producer_workers", "producer_kind", "wire_format",
    "transport", "dali_device", "dali_threads",
)  # fmt: skip
# Fields that differ between any two runs, or only say where the files went: never listed as a difference.
UNLISTED = {"paths", "json_path", "profile_dir", "quiet", "shrunk", "emulation", "emulate", "emulate_rate"}
VERSIONS = ("tensorflow", "torch", "python", "host")


class CompareError(FeedbenchError):
    """Two result files that cannot be compared; the message names the file or the difference."""


# A result file is kilobytes (a long run's, a few megabytes): a larger one is not a result, and is not read whole.
MAX_BYTES = 64 * 2**20


def load(path: str) -> dict:
    """One run's result document from `path`; CompareError naming the file when it is none.

    Only a regular file is read (a FIFO would wait for a writer, a device never end), and at most MAX_BYTES.
    """
    try:
        text = read_regular(path, MAX_BYTES)
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file") from None
    except NotReadable as e:
        words = (
            "a folder, not a result file" if str(e) == "a folder"
            else f"{e}: too large for a result file" if str(e).startswith("over ")
            else f"{e}, not a regular file; give a result file of bench_input.py --json"
        )  # fmt: skip
        raise CompareError(f"{path}: {words}") from None
    except OSError as e:
        raise CompareError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise CompareError(f"{path}: not JSON ({e}); give a result file of bench_input.py --json") from None
    except RecursionError:
        raise CompareError(f"{path}: not a feedbench result (JSON nested too deep to read)") from None
    return checked(path, doc)


def checked(path: str, doc: Any) -> dict:
    """`doc` if it is one run's result with figures to compare; CompareError naming `path` otherwise."""
    if isinstance(doc, dict) and "runs" in doc and "paths" not in doc:
        raise CompareError(f"{path}: a sweep's results (--sweep); compare the results of single runs (--json)")
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), dict):
        raise CompareError(f"{path}: not a feedbench result (no `paths`); give a result file of bench_input.py --json")
    if doc.get("schema_version") not in READS:
        raise CompareError(
            f"{path}: schema_version {doc.get('schema_version')!r}; this feedbench reads "
            + " and ".join(map(str, READS))
        )
    for key in ("framework", "config", "device", "model"):
        if not isinstance(doc.get(key), dict if key != "framework" else str):
            raise CompareError(f"{path}: not a feedbench result (no `{key}`)")
    if doc["config"].get("find_capacity") or doc.get("capacity"):
        raise CompareError(f"{path}: a capacity search's results (--find-capacity): its images/s are one probe's")
    for name, r in doc["paths"].items():
        ips = r.get("images_per_sec") if isinstance(r, dict) else None
        median = ips.get("median") if isinstance(ips, dict) else None
        if not _number(median) or median <= 0:
            raise CompareError(f"{path}: path {name} has no images_per_sec.median to compare")
        bad = _bad_field(r)
        if bad:
            raise CompareError(f"{path}: paths.{name}.{bad[0]}: {bad[1]}; not a result of bench_input.py --json")
    return doc


def _number(x: Any) -> bool:
    """A finite int or float (not a bool): what every figure a comparison reads must be."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _bad_field(r: dict) -> tuple[str, str] | None:
    """(field, what is wrong with it) for the first figure of one path's result that a comparison reads and that
    is not what bench_input.py writes; None when all are."""
    ips = r["images_per_sec"]
    for key in ("repeats", "windows"):
        w = ips.get(key)
        if w is not None and not (isinstance(w, list) and all(_number(x) and x >= 0 for x in w)):
            return f"images_per_sec.{key}", f"{_excerpt(w)} is not a list of finite images/s"
    ratio = r.get("ratio_to_baseline")
    if ratio is not None and not (_number(ratio) and ratio >= 0):
        return "ratio_to_baseline", f"{_excerpt(ratio)} is not a finite ratio"
    u = r.get("uncertainty")
    if u is not None and not isinstance(u, dict):
        return "uncertainty", f"{_excerpt(u)} is not an object"
    interval = (u or {}).get("ratio")
    if interval is not None and not _interval(interval):
        return "uncertainty.ratio", f"{_excerpt(interval)} is not an interval [low, high] of ratios"
    conf = (u or {}).get("ratio_confidence")
    if interval is not None and not (_number(conf) and 0 <= conf <= 1):
        return "uncertainty.ratio_confidence", f"{_excerpt(conf)} is not a confidence between 0 and 1"
    return _bad_telemetry(r.get("telemetry"))


def _interval(x: Any) -> bool:
    """[low, high], 0 <= low <= high; high may be +inf (an interval with a window of no images: [0, inf])."""
    return (
        isinstance(x, list) and len(x) == 2 and _number(x[0]) and 0 <= x[0]
        and isinstance(x[1], int | float) and not isinstance(x[1], bool) and x[1] >= x[0]  # NaN fails >=
    )  # fmt: skip


def _bad_telemetry(tel: Any) -> tuple[str, str] | None:
    """The first telemetry figure `step_shares` reads that is not a finite number (or an object where one is)."""
    if tel is None:
        return None
    objects = [("telemetry", tel)]
    if isinstance(tel, dict):
        cpu = tel.get("cpu")
        objects += [("telemetry.cpu", cpu)]
        if isinstance(cpu, dict):
            objects += [("telemetry.cpu.threads", cpu.get("threads")), ("telemetry.cpu.input", cpu.get("input"))]
            if isinstance(cpu.get("input"), dict):
                objects.append(("telemetry.cpu.input.producers", cpu["input"].get("producers")))
            if isinstance(cpu.get("threads"), dict):
                objects += [(f"telemetry.cpu.threads.{k}", v) for k, v in cpu["threads"].items()]
    for field, value in objects:
        if value is not None and not isinstance(value, dict):
            return field, f"{_excerpt(value)} is not an object"
    read = [(f, v) for f, v in objects if f.startswith("telemetry.cpu.threads.") or f.endswith(".producers")]
    figures = [("telemetry.input_wait_share", tel.get("input_wait_share"))]
    figures += [(f"{f}.cores", v.get("cores")) for f, v in read if isinstance(v, dict)]
    for field, value in figures:
        if value is not None and isinstance(value, int | float) and not _number(value):
            return field, f"{_excerpt(value)} is not finite"
    return None


def _excerpt(x: Any) -> str:
    words = json.dumps(x) if not isinstance(x, float) else repr(x)
    return words if len(words) <= 40 else words[:37] + "..."


def _model(doc: dict) -> str:
    m = doc["model"]
    if m.get("emulated"):
        return f"emulated {m.get('device')} at {m.get('images_per_sec')} img/s"
    return f"{m.get('name')} v{m.get('version')}{' input only' if m.get('input_only') else ''}"


def _shown(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    if v is None or isinstance(v, bool):
        return {None: "none", True: "on", False: "off"}[v]
    return f"{v:g}" if isinstance(v, int | float) else str(v)


def difference(old: dict, new: dict, given_only: bool = False) -> tuple[str, str, Any, Any] | None:
    """The first field in which the machine or configuration of two results differ: (what, field, old, new).

    `new` may be a run's configuration before it ran ({"framework", "config"} only): with `given_only`,
    a field it leaves unset (None: the machine's default) is not compared, nor the machine.
    """
    oc, nc = old["config"], new["config"]
    pairs: list[tuple[str, str, Any, Any]] = []
    if not given_only:
        pairs += [("machine", k, old["device"].get(k), new["device"].get(k)) for k in MACHINE]
    pairs.append(("configuration", "framework", old["framework"], new["framework"]))
    if not given_only:
        pairs.append(("configuration", "model", _model(old), _model(new)))
    pairs += [
        ("configuration", k, oc.get(k), nc.get(k)) for k in CONFIGURATION if not (given_only and nc.get(k) is None)
    ]
    for field, key in (("encryption (--curve-keys)", "curve_keys"), ("external producer (--endpoint)", "endpoint")):
        pairs.append(("configuration", field, oc.get(key) is not None, nc.get(key) is not None))
    return next(((what, field, a, b) for what, field, a, b in pairs if a != b), None)


def refusal(old_name: str, new_name: str, diff: tuple[str, str, Any, Any]) -> str:
    """`OLD.json and NEW.json differ in batch (64 vs 128): a comparison needs the same configuration`."""
    what, field, a, b = diff
    return (
        f"{old_name} and {new_name} differ in {field} ({_shown(a)} vs {_shown(b)}): a comparison needs the same {what}"
    )


def notes(old: dict, new: dict) -> list[str]:
    """What differs and may: library versions, the host's name, and the settings whose effect is measured."""
    out = [
        f"{k} {_shown(old['device'].get(k))} -> {_shown(new['device'].get(k))}"
        for k in VERSIONS
        if old["device"].get(k) != new["device"].get(k)
    ]
    fixed = set(CONFIGURATION) | UNLISTED | {"curve_keys", "endpoint", "framework", "model"}
    keys = [k for k in dict.fromkeys([*old["config"], *new["config"]]) if k not in fixed]
    out += [
        f"{k} {_shown(old['config'].get(k))} -> {_shown(new['config'].get(k))}"
        for k in keys
        if old["config"].get(k) != new["config"].get(k)
    ]
    return out


def step_shares(result: dict) -> dict[str, float]:
    """Where a step's time goes, as shares of it: the input wait, and each stage's CPU over the timed steps.

    `input wait` is the share of a step spent only waiting for input (`telemetry.input_wait_share`); a
    stage's share is its CPU seconds per second of the timed steps (`telemetry.cpu`, its `cores`: above 1.0
    when it keeps several cores busy). Empty without telemetry.
    """
    tel = result.get("telemetry") or {}
    out = {}
    if isinstance(tel.get("input_wait_share"), int | float):
        out["input wait"] = float(tel["input_wait_share"])
    cpu = tel.get("cpu") or {}
    for name, fig in (cpu.get("threads") or {}).items():
        if isinstance((fig or {}).get("cores"), int | float):
            out[f"{name} CPU"] = fig["cores"]
    producers = ((cpu.get("input") or {}).get("producers") or {}).get("cores")
    if cpu.get("producers") and isinstance(producers, int | float):  # the run started producers
        out["producers CPU"] = producers
    return out


def moved_most(old: dict, new: dict) -> tuple[str, float, float] | None:
    """(stage, OLD share, NEW share) of the stage whose share of a step's time moved most; None if unmeasured."""
    a, b = step_shares(old), step_shares(new)
    both = [k for k in a if k in b]
    if not both:
        return None
    stage = max(both, key=lambda k: abs(b[k] - a[k]))
    return stage, a[stage], b[stage]


def _verdict(change: float, lo: float, hi: float, windows: int) -> str:
    """Beyond noise: the interval excludes 1.0 and the change is at least NEGLIGIBLE (1%), which two runs of one
    configuration can differ by between invocations however tight each run's own windows are."""
    if windows < 2:
        return UNKNOWN
    if abs(change - 1.0) < NEGLIGIBLE:
        return WITHIN
    return SLOWER if hi < 1.0 else FASTER if lo > 1.0 else WITHIN


def path_change(old: dict, new: dict, is_baseline: bool) -> dict:
    """One path's change from OLD to NEW: images/s and ratio with their intervals, verdict, stage moved most."""
    ow, nw = window_rates(old), window_rates(new)
    lo, hi, conf, _ = ratio_interval(nw, ow)
    out: dict[str, Any] = {
        "images_per_sec": [old["images_per_sec"]["median"], new["images_per_sec"]["median"]],
        "change": new["images_per_sec"]["median"] / old["images_per_sec"]["median"],
        "interval": [lo, hi],
        "confidence": conf,
        "windows": [len(ow), len(nw)],
        "verdict": _verdict(
            new["images_per_sec"]["median"] / old["images_per_sec"]["median"], lo, hi, min(len(ow), len(nw))
        ),
        "machine_moved": False,
        "ratio": None,
        "ratio_change": None,
        "ratio_interval": None,
        "ratio_confidence": None,
        "moved_most": moved_most(old, new),
    }
    ou, nu = old.get("uncertainty") or {}, new.get("uncertainty") or {}
    ro, rn = old.get("ratio_to_baseline"), new.get("ratio_to_baseline")
    if is_baseline or not ro or not rn:
        return out
    out.update(ratio=[ro, rn], ratio_change=rn / ro)
    if ou.get("ratio") and nu.get("ratio") and ou["ratio"][0] > 0:
        out["ratio_interval"] = [nu["ratio"][0] / ou["ratio"][1], nu["ratio"][1] / ou["ratio"][0]]
        out["ratio_confidence"] = max(0.0, nu["ratio_confidence"] + ou["ratio_confidence"] - 1)
        # A path whose images/s moved beyond noise but whose ratio to its own run's baseline did not cannot be
        # told from a change of the machine's load between the runs, which no window sees: within noise.
        by_ratio = _verdict(rn / ro, *out["ratio_interval"], min(len(ow), len(nw)))
        if out["verdict"] in (SLOWER, FASTER) and by_ratio != out["verdict"]:
            out.update(verdict=WITHIN, machine_moved=True)
    return out


def compare(old: dict, new: dict, names: tuple[str, str] = ("OLD", "NEW")) -> dict:
    """Every path in both results compared (CompareError when machine or configuration differ); see the module."""
    diff = difference(old, new)
    if diff:
        raise CompareError(refusal(*names, diff))
    for doc, name in zip((old, new), names, strict=True):
        refuse_untrained(doc, name)
    paths = {p: path_change(r, new["paths"][p], p == BASELINE) for p, r in old["paths"].items() if p in new["paths"]}
    return {
        "old": names[0],
        "new": names[1],
        "paths": paths,
        "only_old": [p for p in old["paths"] if p not in new["paths"]],
        "only_new": [p for p in new["paths"] if p not in old["paths"]],
        "notes": notes(old, new),
        "exit_status": 1 if any(c["verdict"] == SLOWER for c in paths.values()) else 0,
    }


def refuse_untrained(doc: dict, name: str) -> None:
    """CompareError naming the file and path whose model did not train (profiler/training.py): no figure to compare."""
    for path, r in doc["paths"].items():
        if isinstance(r, dict) and (bad := invalid_reason(r)):
            raise CompareError(
                f"{name}: paths.{path}: {invalid_words(bad)}; a model that does not train gives no figure"
            )


def _pct(x: float) -> str:
    return "+inf%" if math.isinf(x) else f"{100 * (x - 1):+.1f}%"


def _moved_words(m: tuple[str, float, float] | None) -> str:
    if m is None:
        return "not measured"
    stage, a, b = m
    return f"{stage} {100 * a:.0f}% -> {100 * b:.0f}%"


def _row(path: str, c: dict) -> list[str]:
    a, b = c["images_per_sec"]
    ratio = ratio_change = ""
    if c["ratio"]:
        ratio = f"{c['ratio'][0]:.2f} -> {c['ratio'][1]:.2f}"
        ri = c["ratio_interval"]
        ratio_change = _pct(c["ratio_change"]) + (f" ({_pct(ri[0])} to {_pct(ri[1])})" if ri else "")
    elif path == BASELINE:
        ratio = "baseline"
    lo, hi = c["interval"]
    return [
        path,
        f"{rate_figure(a)} -> {rate_figure(b)}",
        f"{_pct(c['change'])} ({_pct(lo)} to {_pct(hi)})",
        ratio,
        ratio_change,
        c["verdict"],
        _moved_words(c["moved_most"]),
    ]


def text(result: dict) -> str:
    """The comparison for people: a table, how its intervals were taken, what differs, and the exit status."""
    paths = result["paths"]
    lines = [f"{result['old']} -> {result['new']}"]
    if paths:
        headers = ["input path", "images/s", "change (interval)", "vs gpu", "change (interval)", "verdict",
                   "share of a step that moved most"]  # fmt: skip
        lines.append(tabulate([_row(p, c) for p, c in paths.items()], headers=headers, disable_numparse=True))
        confs = sorted({round(100 * c["confidence"]) for c in paths.values()})
        rconfs = sorted({round(100 * c["ratio_confidence"]) for c in paths.values() if c["ratio_confidence"]})
        lines.append(
            f"intervals: images/s, NEW's windows against OLD's by pairwise ratios ({'/'.join(map(str, confs))}% "
            "confidence); vs gpu, from each file's own ratio interval"
            + (f" (at least {'/'.join(map(str, rconfs))}%)" if rconfs else "")
        )
    else:
        lines.append("no input path is in both files")
    for side in ("old", "new"):
        if result[f"only_{side}"]:
            lines.append(f"only in {result[side]}: {', '.join(result[f'only_{side}'])}")
    if result["notes"]:
        lines.append("differs, and may: " + "; ".join(result["notes"]))
    moved = [p for p, c in paths.items() if c["machine_moved"]]
    if moved:
        lines.append(
            f"{', '.join(moved)}: images/s moved beyond the windows' noise, the ratio to the baseline of the same run "
            "did not: a change of the machine's load between the runs would do that; read within noise"
        )
    slower = [p for p, c in paths.items() if c["verdict"] == SLOWER]
    lines.append(
        f"exit 1: slower beyond noise: {', '.join(slower)}" if slower else "exit 0: no path slower beyond noise"
    )
    return "\n".join(lines)


def compare_files(old_path: str, new_path: str) -> int:
    """Print the comparison of two result files; the exit status (CompareError for bad input)."""
    result = compare(load(old_path), load(new_path), (old_path, new_path))
    print(text(result), flush=True)
    return result["exit_status"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise CompareError(message)


def main(argv: list[str] | None = None) -> int:
    """`python -m profiler.compare OLD.json NEW.json`: exit 1 when a path is slower beyond noise, 2 for bad input."""
    p = _Parser(prog="python -m profiler.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("old", metavar="OLD.json", help="the earlier result (bench_input.py --json)")
    p.add_argument("new", metavar="NEW.json", help="the later result, of the same machine and configuration")
    try:
        args = p.parse_args(argv)
        return compare_files(args.old, args.new)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
