"""A GPU machine's first run checks itself: every PyTorch path, a few steps, with no hidden host-device sync.

`python -m harness.torch.gpu_check` on a machine without an NVIDIA GPU prints
one line saying so and exits 0; on one whose driver reports GPUs that torch
cannot see (a driver older than torch's CUDA) it names the driver and the fix
in one line and exits 1. With GPUs it

1. measures the pinned and pageable host -> device copy bandwidth of every GPU
   (pinned: the ceiling of every path that copies batches);
2. trains every declared PyTorch input path (consumers/<path>/path.py; all but
   those `NOT_HERE` names, with why) for a few steps in one torchrun launch
   (the `gpu` baseline first; zmq-consume over shm:// in a second launch,
   its ranks' own producers writing the slots), with
   `torch.cuda.set_sync_debug_mode("error")` in the timed steps, so a step
   that makes the host wait for the device (an `.item()`) fails the path;
   a copy from pageable memory, which that mode cannot see, is refused by
   the paths' own pinned check (feeders/device_copy.py `to_device`);
3. prints a table of each path's images/s and its ratio to the `gpu` path.

It exits non-zero when any path fails, or when zmq-consume over shm:// did
not read its batches from CUDA-registered regions. `dali` and `spdl` read a
small JPEG folder it makes; a path its declaration's checks refuse (its
library not installed) is skipped with the check's line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from consumers import declared
from core.cli_types import positive_int
from core.errors import ConfigError

# zmq-consume over shm:// (the ranks' own producers): tensors over the slots, DMA from CUDA-registered regions.
SHM = "zmq-consume-shm"
# The declared paths this check does not train, and why.
NOT_HERE = {
    "loader": "it trains the user's --loader; the check has none",
    "gpu-decode": "bench_input.py --real-data measures it on the GPU (scripts/gpu_torch_run.sh's real-data step)",
}


def check_paths() -> list[str]:
    """Every declared PyTorch path but those NOT_HERE, in table order; zmq-consume also over shm:// (SHM)."""
    out = []
    for name in declared.names("torch"):
        if name not in NOT_HERE:
            out += [name, SHM] if name == "zmq-consume" else [name]
    return out


PATHS = check_paths()


def launches(paths: list[str]) -> list[tuple[list[str], bool]]:
    """The torchrun launches that train `paths`: (paths, over shm://); start-up shared by all but shm's."""
    plain = [p for p in paths if p != SHM]
    return ([(plain, False)] if plain else []) + ([(["zmq-consume"], True)] if SHM in paths else [])


def shm_problem(result: dict) -> str | None:
    """Why zmq-consume over shm:// did not read its batches in place by DMA from registered regions; None if it did."""
    regions = result.get("cuda_regions") or {}
    if regions.get("refused"):
        return (
            f"CUDA refused to register {regions['refused']} shared-memory region(s) (cudaHostRegister; "
            f"{regions.get('registered', 0)} registered): those batches were copied from pageable memory"
        )
    if not result.get("zero_copy"):
        return "zmq-consume over shm:// copied its batches (zero_copy false)"
    return None


def check_config(paths: list[str], shm: bool, args: argparse.Namespace, data: str, gpus: int):
    """The BenchConfig that trains `paths` in one launch (over shm:// when `shm`)."""
    from consumers.expect import receive_cap
    from core.config import BenchConfig, apply_defaults

    cfg = BenchConfig(
        paths=paths, num_gpus=gpus, batch=args.batch, image_size=args.image_size, warmup_steps=args.warmup_steps,
        steps=args.steps, repeats=args.repeats, producers=2 * gpus, producer_workers=2, data=data, recv_timeout=60,
        use_fp16=args.use_fp16, input_only=args.input_only, transport="shm" if shm else "ipc",
    )  # fmt: skip
    apply_defaults(cfg, gpus)
    cfg.max_msg_size = receive_cap(cfg.batch, cfg.image_size)
    return cfg


def refused(paths: list[str], args: argparse.Namespace, data: str, gpus: int) -> dict[str, str]:
    """{path: the line its declaration's checks refuse it with here (its library not installed)}."""
    known = declared.of("torch")
    out = {}
    for name in paths:
        try:
            known["zmq-consume" if name == SHM else name].check(check_config([name], False, args, data, gpus), "torch")
        except ConfigError as e:
            out[name] = str(e)
    return out


def run_paths(paths: list[str], shm: bool, args: argparse.Namespace, data: str, gpus: int) -> tuple[dict, str | None]:
    """Train `paths` in one torchrun launch: ({path: result}, None) or ({}, the one line saying why it failed)."""
    from harness.torch.launch import Nodes, launch
    from harness.torch.run import SYNC_DEBUG_ENV

    cfg = check_config(paths, shm, args, data, gpus)
    folder = tempfile.mkdtemp(prefix="feedbench-check-")
    os.environ[SYNC_DEBUG_ENV] = "error"  # the ranks inherit it
    try:
        rc, doc, errors = launch(gpus, Nodes(), cfg.to_dict(), folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if rc != 0 or doc is None:
        return {}, errors[0] if errors else f"torchrun exited with code {rc}"
    results = dict(doc["paths"])
    if shm:
        results = {SHM: results["zmq-consume"]}
        why = shm_problem(results[SHM])
        if why:
            return {}, why
    return results, None


def print_bandwidth(gpus: int) -> None:
    """Each GPU's host-to-device copy bandwidth, pinned and pageable."""
    import torch

    from harness.torch.bandwidth import copy_gbps

    for i in range(gpus):
        dev = torch.device("cuda", i)
        pinned, pageable = (copy_gbps(256_000_000, pin, repeats=5, device=dev) for pin in (True, False))
        print(
            f"  GPU {i} ({torch.cuda.get_device_name(i)}): host->device {pinned:.1f} GB/s pinned, {pageable:.1f} pageable"
        )


def result_rows(results: dict[str, dict]) -> list[list[str]]:
    """The table's rows: images/s, ratio to the gpu path (added to each result), input wait, what was checked."""
    base = (results.get("gpu") or {}).get("images_per_sec", {}).get("median")
    rows = []
    for path, r in results.items():
        rate = r["images_per_sec"]["median"]
        r["ratio_to_baseline"] = rate / base if base else None
        share = r.get("telemetry", {}).get("input_wait_share")
        rows.append([
            path, f"{rate:.1f}", f"{rate / base:.2f}" if base else "n/a",
            "n/a" if share is None else f"{100 * share:.0f}%",
            "ok" + (f" (decoded on {r['decoded_on'][0]['on']})" if r.get("decoded_on") else "")
            + (" (zero copy: tensors over the slots, DMA from registered regions)" if r.get("zero_copy") else ""),
        ])  # fmt: skip
    return rows


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The check's flags."""
    p = argparse.ArgumentParser(prog="python -m harness.torch.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=positive_int, default=64, help="per GPU")
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--warmup-steps", type=positive_int, default=5)
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--num-gpus", type=positive_int, help="default: every GPU")
    p.add_argument("--use-fp16", action="store_true", help="float16 autocast with a GradScaler")
    p.add_argument("--input-only", action="store_true", help="no model: each path's ceiling")
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated; the gpu baseline always runs first")
    p.add_argument("--json", help="also write every path's result here ({'paths': {path: result}})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    wanted = [x.strip() for x in a.paths.split(",") if x.strip()]
    unknown = [x for x in wanted if x not in PATHS]
    if unknown:
        not_here = "".join(f"; {x}: {NOT_HERE[x]}" for x in unknown if x in NOT_HERE)
        print(f"error: --paths: unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}{not_here}",
              file=sys.stderr)  # fmt: skip
        return 2

    import torch

    from harness.torch.gpu_visibility import unseen_gpu_problem

    problem = unseen_gpu_problem(torch)
    if problem:  # the driver has GPUs torch cannot use: a failed check, never "nothing to check"
        print(f"gpu-check (PyTorch): {problem}", file=sys.stderr)
        return 1
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("gpu-check (PyTorch): no CUDA GPU on this machine; nothing to check")
        return 0
    from runner import shutdown

    shutdown.install()  # Ctrl-C stops the ranks and their producers
    from tabulate import tabulate

    gpus = min(a.num_gpus or torch.cuda.device_count(), torch.cuda.device_count())
    print(f"gpu-check (PyTorch {torch.__version__}): {gpus} GPU(s), batch {a.batch}, {a.image_size}x{a.image_size}")
    print_bandwidth(gpus)
    order = ["gpu"] + [x for x in wanted if x != "gpu"]
    data = tempfile.mkdtemp(prefix="feedbench-jpegs-")
    skipped = refused(order, a, data, gpus)
    rows = [[x, "", "", "", f"skipped: {why}"] for x, why in skipped.items()]
    order = [x for x in order if x not in skipped]
    results, failed = {}, 0
    try:
        if any(x in order for x in ("dali", "spdl")):
            from producers.dataset import make_dataset

            make_dataset(data, classes=4, per_class=16)
        for paths, shm in launches(order):
            print(f"- {', '.join([SHM] if shm else paths)} (one torchrun launch) ...", flush=True)
            got, why = run_paths(paths, shm, a, data, gpus)
            results.update(got)
            if why is not None:
                failed += 1
                rows += [[x, "", "", "", f"FAILED: {why}"] for x in ([SHM] if shm else paths)]
    finally:
        shutil.rmtree(data, ignore_errors=True)
    rows += result_rows(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"paths": results}, f, indent=1)
    print()
    print(tabulate(rows, headers=["path", "images/s", "vs gpu", "input wait", "check"], disable_numparse=True))
    if failed:
        print(f"\n{failed} launch(es) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
