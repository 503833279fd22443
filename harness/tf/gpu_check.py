"""TensorFlow's real placement of every path on this machine, compared with the plan the graph states.

`python -m harness.tf.gpu_check` builds each default path's graph with
ResNet-50 on this machine's GPUs (every path with the replicated update, the
parameter-server updates with the first path: they move variables, not the
input's ops), opens a session
as the trainer does (soft placement allowed) with `log_device_placement`,
and reads the device TensorFlow's placer gave every op (it places the whole
graph when the session first runs, so nothing needs to be fed). Any op whose
device differs from the one the graph asks for (its own, or its colocation
group's) was moved, most often by soft placement to the host; each is named.
It also asks the kernel registry (harness/tf/kernels.py) which ops would be
moved. `--multi-gpu N` also builds every path's replicated graphs for N GPUs
(the NCCL all-reduce of the gradients), which one GPU never builds.
Exit status 0 when every path is placed as planned, 1 when not.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import tempfile

from consumers import declared
from core.config import BenchConfig, apply_defaults
from core.errors import FeedbenchError
from frameworks.tf_env import import_tf
from harness.tf import devices, kernels
from harness.tf.run import build

tf = import_tf()

UPDATES = [("replicated", "cpu"), ("parameter_server", "cpu"), ("parameter_server", "gpu")]
# What the placer prints for each node with log_device_placement: "name: (Type): /job:.../device:GPU:0".
PLACED = re.compile(r"^(\S+): \((\w+)\): (/job:\S+)$")


def planned_device(graph, op) -> str | None:
    """The device the graph asks for `op`: its own, else its colocation group's; None if it leaves it open."""
    if op.device:
        return op.device
    for group in op.colocation_groups():
        name = group.decode()[len("loc:@") :]
        if name != op.name:
            return graph.get_operation_by_name(name).device or None
    return None


def _same(a: str, b: str) -> bool:
    x, y = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
    return (x.device_type or "").upper() == (y.device_type or "").upper() and (x.device_index or 0) == (
        y.device_index or 0
    )


def placed_devices(graph, config) -> dict[str, str]:
    """Every op's device as TensorFlow's placer assigns it in a session made with `config`.

    The placer prints one line per node to the process's standard output (C
    stdio, not Python's), so that file descriptor is sent to a temporary file
    while the session places the graph.
    """
    config = type(config).FromString(config.SerializeToString())
    config.log_device_placement = True
    with graph.as_default():
        probe = tf.no_op(name="gpu_check_placement_probe")
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            with tf.compat.v1.Session(graph=graph, config=config) as sess:
                sess.run(probe)
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
    return {m.group(1): m.group(3) for m in map(PLACED.match, text.splitlines()) if m}


def moved_ops(graph, placed: dict[str, str]) -> tuple[int, list[str]]:
    """(ops with a planned device, one line per op TensorFlow put elsewhere: `name (Type): planned -> placed`)."""
    checked, moved = 0, []
    for op in graph.get_operations():
        want = planned_device(graph, op)
        got = placed.get(op.name)
        if want is None or got is None:
            continue
        checked += 1
        if not _same(want, got):
            moved.append(f"{op.name} ({op.type}): {want} -> {got.split('/')[-1] if '/' in got else got}")
    return checked, moved


def check_path(path: str, n: int, update: tuple[str, str], has_gpu: bool = True) -> dict:
    """Build `path` for `n` devices, place it for real, and compare: {path, update, checked, moved, no_kernel}."""
    cfg = BenchConfig(paths=[path], num_gpus=n, variable_update=update[0], ps_device=update[1])
    apply_defaults(cfg, n if has_gpu else 0)
    built = build(cfg, path, n, has_gpu, endpoint=f"ipc://{tempfile.gettempdir()}/feedbench-gpu-check-{os.getpid()}")
    checked, moved = moved_ops(built.graph, placed_devices(built.graph, devices.session_config(n, has_gpu)))
    no_kernel = kernels.missing_gpu_kernels(built.graph) if kernels.registry_has_gpu_kernels() else []
    return {"path": path, "update": "-".join(update), "checked": checked, "moved": moved, "no_kernel": no_kernel}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tf.gpu_check", description=__doc__)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--num-gpus", type=int, default=None, help="devices to build for (default: every GPU)")
    p.add_argument("--multi-gpu", type=int, default=0, help="also the replicated (NCCL) graphs for this many GPUs")
    a = p.parse_args(argv)
    try:
        gpus = devices.gpu_count()
    except FeedbenchError as e:
        print(f"tensorflow: {e}")
        return 1
    if not gpus:
        print("tensorflow: no GPU on this machine: nothing to place")
        return 0
    n = min(a.num_gpus or gpus, gpus)
    paths = declared.default_run("tf")
    # Every path with the replicated update; the parameter-server updates move variables, not the input's
    # ops, so they are checked with the first path only (7 graphs, not 15, on one GPU).
    plans = [(path, n, UPDATES[0]) for path in paths] + [(paths[0], n, update) for update in UPDATES[1:]]
    multi = min(a.multi_gpu, gpus)
    if multi > 1 and multi != n:  # replicated: NCCL all-reduce between towers
        plans += [(path, multi, UPDATES[0]) for path in paths]
    results, bad = [], 0
    for path, devices_n, update in plans:
        r = check_path(path, devices_n, update)
        r["gpus"] = devices_n
        results.append(r)
        ok = not r["moved"] and not r["no_kernel"]
        bad += not ok
        print(
            f"tensorflow placement {path:15s} {r['update']:18s} {devices_n} GPU(s) "
            + (f"as planned ({r['checked']} ops)" if ok else f"{len(r['moved'])} of {r['checked']} ops moved"),
            flush=True,
        )
        for line in r["moved"] + [f"no GPU kernel: {x}" for x in r["no_kernel"]]:
            print(f"    {line}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
