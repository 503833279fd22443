"""The PyTorch plugin of the harness (harness/run.py `Trainer`): torchrun ranks, DDP, and what they report.

`bench_input.py --framework torch` drives it like the TensorFlow one: the
harness applies defaults, checks and reports; this plugin only says what
PyTorch sees and adds, and trains a list of paths in one torchrun launch
(launch.py starts it; each rank runs harness/torch/run.py:worker and rank 0
combines every rank's figures into one result per path).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import tempfile
from pathlib import Path
from typing import Any

from core.config import BenchConfig
from core.errors import ConfigError, InputError
from core.gpus import libcuda_loads, nvidia_gpus
from core.machine import host_fields
from harness.torch.gpu_visibility import unseen_gpu_problem
from harness.torch.launch import Nodes

HALF_CUDA, HALF_CPU = "float16", "bfloat16"  # --use-fp16: autocast's half type on each kind of device


def plugin(args: argparse.Namespace) -> TorchTrainer:
    return TorchTrainer(Nodes(args.nnodes, args.node_rank, args.master_addr, args.master_port))


class TorchTrainer:
    """PyTorch on torchrun: ranks of DistributedDataParallel, one launch per list of paths."""

    framework = "torch"

    def __init__(self, nodes: Nodes) -> None:
        nodes.check()
        self.nodes = nodes
        self.words = f"PyTorch {installed_version()}"
        self._device: dict | None = None  # rank 0's description of the machine, from the last launch

    @property
    def torch(self) -> Any:
        """torch, imported on first use: a run on a machine without an NVIDIA driver never imports it here
        (the ranks do), which spares each launch about a second of CPU."""
        import torch

        return torch

    def gpu_count(self) -> int:
        if not nvidia_gpus() and not libcuda_loads():
            return 0  # no NVIDIA driver here: torch could see no GPU, and a CPU run need not import it
        gpus = self.torch.cuda.device_count()
        problem = unseen_gpu_problem(self.torch)
        if problem:  # never a silent run on the host of a GPU machine
            raise ConfigError(problem)
        return gpus

    def defaults(self, cfg: BenchConfig, gpus: int) -> list[str]:
        layout = channels_last_default(cfg, gpus)
        return [layout] if layout else []

    def check(self, cfg: BenchConfig, gpus: int) -> None:
        check_memory(cfg, gpus)

    def devices(self, cfg: BenchConfig) -> int:
        return cfg.num_gpus * self.nodes.nnodes

    def header(self, cfg: BenchConfig, model: str, gpus: int) -> str:
        world = self.devices(cfg)
        kind = "GPU" if gpus else "CPU"
        half = f", AMP {HALF_CUDA if gpus else HALF_CPU}" if cfg.use_fp16 else ""
        compiled = ", torch.compile" if cfg.use_xla_compile else ""
        ddp = f", DDP {'nccl' if gpus else 'gloo'}" if world > 1 and not cfg.input_only else ""
        nodes = f" on {self.nodes.nnodes} nodes" if self.nodes.nnodes > 1 else ""
        return (
            f"feedbench ({self.words}): {model}, {world} {kind} rank(s){nodes} x batch {cfg.batch}, "
            f"{cfg.image_size}x{cfg.image_size} {cfg.data_format}{half}{compiled}{ddp}, "
            f"{cfg.warmup_steps} warm-up + {cfg.repeats} x {cfg.steps} steps"
        )

    def describe(self) -> dict[str, Any]:
        device = self._device or describe_machine(self.torch)
        return {**device, "nodes": self.nodes.nnodes}

    def config_fields(self) -> dict[str, Any]:
        return {"nnodes": self.nodes.nnodes}

    def run(self, cfg: BenchConfig) -> dict[str, dict] | None:
        doc = launch_paths(cfg, self.nodes)
        if doc is None:
            return None
        self._device = {**doc["device"], "ranks": self.devices(cfg)}
        return doc["paths"]

    def run_in_turn(self, cfg: BenchConfig) -> list[dict]:
        # One launch for the whole alternation: a launch per window would spend most of the run starting
        # ranks and building the model (about 25 s each for ResNet-50 on an H200, against 2 s of steps).
        doc = launch_paths(cfg, self.nodes)
        if doc is None:
            raise ConfigError("--interleave ran on several machines: alternate on one node (--nnodes 1)")
        self._device = {**doc["device"], "ranks": self.devices(cfg)}
        return doc["runs"]

    def how_to_open(self, profile_dir: str) -> str:
        from harness.torch.tracing import how_to_open

        return how_to_open(profile_dir)


def installed_version() -> str:
    """torch.__version__ (with its build, e.g. 2.14.1+cu130), read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("--framework torch: PyTorch is not installed (run `make install`)")
    text = (Path(spec.submodule_search_locations[0]) / "version.py").read_text()
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else "(version unknown)"


def describe_machine(torch_mod, bandwidth: bool = False) -> dict:
    """The machine, for the report; `bandwidth`: also the pinned and pageable copy bandwidth to GPU 0 (2 s)."""
    gpus = [torch_mod.cuda.get_device_name(i) for i in range(torch_mod.cuda.device_count())]
    extra = {}
    if gpus and bandwidth:
        from harness.torch.bandwidth import copy_gbps

        # The ceiling of every path that copies batches to the device (about 2 s to measure).
        extra["h2d_gbps"] = {"pinned": copy_gbps(256_000_000, True), "pageable": copy_gbps(256_000_000, False)}
    return {**extra, "gpus": gpus, **host_fields(), "torch": torch_mod.__version__}


def channels_last_default(cfg: BenchConfig, gpus: int) -> str | None:
    """On CUDA with --use-fp16, NHWC (channels-last) unless asked otherwise; a note saying which and why."""
    if not gpus:
        return None
    if cfg.use_fp16 and cfg.data_format is None:
        cfg.data_format = "NHWC"
        return (
            "--data-format NHWC: channels-last, as PyTorch recommends for float16 on CUDA "
            "(tensor-core convolutions read NHWC; NCHW adds transposes); --data-format NCHW to compare"
        )
    if cfg.use_fp16 and cfg.data_format == "NCHW":
        return "--data-format NCHW as asked: PyTorch recommends channels-last (NHWC) for float16 on CUDA"
    if cfg.data_format is None:
        return (
            "--data-format NCHW: float32 on CUDA, where channels-last gains little; with --use-fp16 the default is NHWC"
        )
    return None


def check_memory(cfg: BenchConfig, gpus: int) -> None:
    """Refuse, with the figure, a run whose ranks cannot fit in this machine's memory or its GPUs' (ConfigError)."""
    import psutil

    from consumers import declared
    from runner import memory

    known = declared.of("torch")
    fed = not cfg.endpoint and any(known[p].needs_producers for p in cfg.paths if p in known)
    est = memory.estimate(
        cfg.batch, cfg.image_size, cfg.num_gpus, gpus,
        stand_in=cfg.stand_in, half=cfg.use_fp16,
        producers=cfg.producers if fed else 0, producer_workers=cfg.producer_workers, hwm=cfg.hwm,
    )  # fmt: skip
    device = None
    if gpus:
        import torch

        # The smallest GPU's total memory: asking for its free memory would open a CUDA context here.
        device = min(torch.cuda.get_device_properties(i).total_memory for i in range(cfg.num_gpus))
    what = f"--batch {cfg.batch} at --image-size {cfg.image_size}"
    line = memory.check(est, psutil.virtual_memory().available, device, what, cfg.num_gpus)
    if line:
        raise ConfigError(line)


def launch_paths(cfg: BenchConfig, nodes: Nodes) -> dict | None:
    """One torchrun launch of every path in `cfg`; rank 0's document, or None on other nodes.

    Raises InputError with the line that explains a failure (a rank's own, or how a rank died).
    The run's folder is removed on every exit, Ctrl-C and SIGTERM included.
    """
    import shutil

    from consumers.expect import receive_cap
    from harness.torch.launch import launch
    from runner import shutdown

    if cfg.max_msg_size is None:
        cfg.max_msg_size = receive_cap(cfg.batch, cfg.image_size)
    tmp = tempfile.mkdtemp(prefix="feedbench-")

    def remove() -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    shutdown.register(remove)  # registered first, so it runs after the launcher is stopped
    try:
        rc, doc, errors = launch(cfg.num_gpus, nodes, cfg.to_dict(), tmp)
    finally:
        shutdown.unregister(remove)
        remove()
    if rc != 0:
        raise InputError(errors[0])
    if nodes.node_rank != 0:
        print(f"node {nodes.node_rank}: done; node 0 writes the report")
        return None
    if doc is None:
        raise InputError("rank 0 wrote no result")
    return doc
