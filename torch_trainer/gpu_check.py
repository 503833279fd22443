"""A GPU machine's first run checks itself: every PyTorch path, a few steps, with no hidden host-device sync.

`python -m torch_trainer.gpu_check` on a machine without a CUDA GPU prints one
line saying so and exits 0. With one, it

1. measures the pinned host -> device copy bandwidth of every GPU (the
   ceiling of every path that copies batches);
2. trains each PyTorch input path for a few steps on every GPU (one torchrun
   launch per path, the `gpu` baseline first), with
   `torch.cuda.set_sync_debug_mode("error")` in the timed steps, so a step
   that makes the host wait for the device (a pageable copy, an `.item()`)
   fails the path instead of silently slowing it;
3. prints a table of each path's images/s and its ratio to the `gpu` path.

It exits non-zero when any path fails. `dali` and `spdl` read a small JPEG
folder it makes; a path whose library is not installed is listed as skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile

from core.cli_types import positive_int

# zmq-consume over shm:// (external producers per rank): tensors over the slots, DMA from CUDA-registered regions.
SHM = "zmq-consume-shm"
PATHS = ["gpu", "cpu", "python-queue", "python-dataset", "zmq-consume", SHM, "dali", "spdl"]
NEEDS = {
    "dali": "nvidia.dali.plugin.pytorch",
    "spdl": "spdl.pipeline",
    "zmq-consume": "zmq_ops.receiver",
    SHM: "zmq_ops.receiver",
}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def run_path(path: str, args: argparse.Namespace, data: str, gpus: int) -> tuple[dict | None, str | None]:
    """(the path's result, None) or (None, the one line saying why it failed)."""
    from consumers.expect import receive_cap
    from core.config import BenchConfig, apply_defaults
    from torch_trainer.launch import Nodes, launch
    from torch_trainer.run import SYNC_DEBUG_ENV

    shm = path == SHM
    path = "zmq-consume" if shm else path
    cfg = BenchConfig(
        paths=[path], num_gpus=gpus, batch=args.batch, image_size=args.image_size, warmup_steps=args.warmup_steps,
        steps=args.steps, repeats=args.repeats, producers=2 * gpus, producer_workers=2, data=data, recv_timeout=60,
        use_fp16=args.use_fp16, input_only=args.input_only,
    )  # fmt: skip
    apply_defaults(cfg, gpus)
    cfg.max_msg_size = receive_cap(cfg.batch, cfg.image_size)
    folder = tempfile.mkdtemp(prefix="feedbench-check-")
    os.environ[SYNC_DEBUG_ENV] = "error"  # the ranks inherit it
    producers = []
    if shm:  # each rank binds shm://NAME-r<rank>; one producer per rank, writing every batch anew
        import subprocess

        cfg.endpoint = f"shm://fbcheck-{os.getpid()}"
        for r in range(gpus):
            producers.append(subprocess.Popen([
                sys.executable, "-m", "producers", "synthetic", "--endpoint", f"{cfg.endpoint}-r{r}", "--quiet",
                "--batch", str(cfg.batch), "--image-size", str(cfg.image_size), "--producer-id", str(1000 * r),
            ]))  # fmt: skip
    try:
        rc, doc, errors = launch(gpus, Nodes(), cfg.to_dict(), folder)
    finally:
        for q in producers:
            q.terminate()
            q.wait(30)
        shutil.rmtree(folder, ignore_errors=True)
    if rc != 0:
        return None, errors[0] if errors else f"torchrun exited with code {rc}"
    result = doc["paths"][path]
    if shm and not result.get("zero_copy"):
        return None, "zmq-consume over shm:// copied its batches (zero_copy false)"
    return result, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_trainer.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=positive_int, default=64, help="per GPU")
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--warmup-steps", type=positive_int, default=5)
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--num-gpus", type=positive_int, help="default: every GPU")
    p.add_argument("--use-fp16", action="store_true", help="float16 autocast with a GradScaler")
    p.add_argument("--input-only", action="store_true", help="no model: each path's ceiling")
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated; the gpu baseline always runs first")
    a = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("gpu-check (PyTorch): no CUDA GPU on this machine; nothing to check")
        return 0
    from runner import shutdown

    shutdown.install()  # Ctrl-C stops the ranks and their producers
    from tabulate import tabulate

    from torch_trainer.bandwidth import copy_gbps

    gpus = min(a.num_gpus or torch.cuda.device_count(), torch.cuda.device_count())
    print(f"gpu-check (PyTorch {torch.__version__}): {gpus} GPU(s), batch {a.batch}, {a.image_size}x{a.image_size}")
    for i in range(gpus):
        dev = torch.device("cuda", i)
        gbps = copy_gbps(256_000_000, True, repeats=5, device=dev)
        print(f"  GPU {i} ({torch.cuda.get_device_name(i)}): pinned host->device {gbps:.1f} GB/s")
    wanted = [x.strip() for x in a.paths.split(",") if x.strip()]
    unknown = [x for x in wanted if x not in PATHS]
    if unknown:
        print(f"error: --paths: unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}", file=sys.stderr)
        return 2
    order = ["gpu"] + [x for x in wanted if x != "gpu"]
    data = tempfile.mkdtemp(prefix="feedbench-jpegs-")
    rows, failed, base = [], 0, None
    try:
        if any(x in order for x in ("dali", "spdl")):
            from producers.dataset import make_dataset

            make_dataset(data, classes=4, per_class=16)
        for path in order:
            if path in NEEDS and not _importable(NEEDS[path]):
                rows.append([path, "", "", "", f"skipped: {NEEDS[path]} is not installed"])
                continue
            print(f"- {path} ...", flush=True)
            r, why = run_path(path, a, data, gpus)
            if r is None:
                failed += 1
                rows.append([path, "", "", "", f"FAILED: {why}"])
                continue
            rate = r["images_per_sec"]["median"]
            base = rate if path == "gpu" else base
            share = r.get("telemetry", {}).get("input_wait_share")
            rows.append([
                path, f"{rate:.1f}", f"{rate / base:.2f}" if base else "n/a",
                "n/a" if share is None else f"{100 * share:.0f}%",
                "ok" + (f" (decoded on {r['decoded_on'][0]['on']})" if r.get("decoded_on") else "")
                + (" (zero copy: tensors over the slots, DMA from registered regions)" if r.get("zero_copy") else ""),
            ])  # fmt: skip
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print()
    print(tabulate(rows, headers=["path", "images/s", "vs gpu", "input wait", "check"], disable_numparse=True))
    if failed:
        print(f"\n{failed} path(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
