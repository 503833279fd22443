"""What one benchmark run is: flags, their defaults, and the smaller defaults for CPU-only machines."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from core.registry import BASELINE

__all__ = ["BASELINE", "BenchConfig", "CPU_DEFAULTS", "GPU_DEFAULTS", "apply_defaults"]

# The DLPerf / tf_cnn_benchmarks defaults, for a machine with GPUs.
GPU_DEFAULTS = {"image_size": 224, "batch": 64, "warmup_steps": 20, "steps": 100, "repeats": 7}
# Without a GPU, ResNet-50 runs at a few images/s: these keep the default five-path run to a few minutes.
CPU_DEFAULTS = {"image_size": 64, "batch": 4, "warmup_steps": 2, "steps": 4, "repeats": 3}
# An emulated device costs no host CPU, so its runs keep real image sizes even without a GPU; its
# batch is chosen from the rate (see emulated_batch) so that a step lasts long enough to pace precisely.
EMULATED_DEFAULTS = {"image_size": 224, "warmup_steps": 8, "steps": 24, "repeats": 3}
EMULATED_STEP_S = 0.05
# On a GPU each path's ratio comes from this many (baseline, path) pairs of alternated runs: a GPU that warms up
# or slows down between paths moves both sides of a ratio (docs/gpu.md); a capacity search probes instead.
INTERLEAVE_GPU = 3  # the step time the default emulated batch aims at


@dataclass
class BenchConfig:
    """Everything that defines one run; `None` means "use the machine's default"."""

    paths: list[str] = field(default_factory=list)  # input path names (the CLI fills in the registry's default run)
    num_gpus: int | None = None
    batch: int | None = None  # per device
    image_size: int | None = None
    warmup_steps: int | None = None
    steps: int | None = None
    repeats: int | None = None
    variable_update: str = "replicated"
    ps_device: str = "cpu"
    resnet_version: str = "1.5"
    data_format: str | None = None
    use_fp16: bool = False
    use_xla_compile: bool = False
    learning_rate: float | None = None  # after the warm-up (None: 0.1 x total batch / 256; profiler/training.py)
    input_only: bool = False
    model: str = "resnet50"  # or "emulated": a device consuming batches at a set rate (core/emulate.py)
    emulate: str | None = None  # preset name (--emulate)
    emulate_rate: float | None = None  # images/s per device (--emulate-rate), wins over the preset's
    emulation: dict | None = None  # filled by apply_defaults: {"emulated", "device", "images_per_sec", "source"}
    find_capacity: bool = False
    capacity_tries: int = (
        3  # --capacity-tries: extra tries at each path's decisive probes (profiler/capacity.py CONFIRM)
    )
    capacity_probes: int = 5  # --capacity-probes: probes per path before the bisection stops
    probe_warmup_s: float = 3.0  # --probe-warmup: a capacity probe's least warm-up at the demand, seconds
    probe_window_s: float = 1.5  # --probe-window: a capacity probe's least timed window, seconds
    producers: int = 2
    dataset_workers: int | None = None  # PyTorch python-dataset's loader workers per rank (None: one per producer)
    producer_workers: int = 1
    producer_kind: str = "synthetic"  # synthetic, decode, dali, or loader (the user's own: --loader)
    loader: str | None = None  # --loader MODULE:CALLABLE (core/loader_spec.py)
    loader_arg: list[str] = field(default_factory=list)  # --loader-arg key=value, passed to the callable
    loader_timeout: float = 60.0  # seconds without a batch before the loader is called hung
    dali_threads: int | None = None  # threads of each DALI pipeline (None: see apply_defaults)
    dali_device: str | None = None  # where DALI decodes, in the dali path and the dali producers: cpu or gpu
    data: str | None = None
    wire_format: str = "native"
    transport: str = "ipc"  # how the run's own producers reach it: ipc sockets, or shm slots (wire/shm.py)
    endpoint: str | None = None  # an external producer's endpoint (the run binds it and waits)
    hwm: int = 4
    recv_timeout: float = 60.0
    on_producer_exit: str = "stop"  # or "continue" on the remaining producers
    allow_remote: bool = False
    curve_keys: str | None = None  # CURVE key folder for the producers' streams (wire/curve.py)
    max_msg_size: int | None = None
    json_path: str | None = None
    telemetry: bool = True  # per-stage telemetry and a verdict (--no-telemetry to compare its overhead)
    telemetry_every: int = 4  # trace every n-th measured step for input wait (harness/tf/telemetry.py)
    producer_busy_wait: bool = False  # producers spin while the consumer has no room (a polling loader)
    producer_cpu_ms: float | None = None  # synthetic producers spend this CPU time per batch (a CPU-hungry loader)
    producer_rate: float | None = None  # cap each producer worker at this many images/s (a slow loader)
    profile_dir: str | None = None  # --profile: a trace of a few untimed steps per path (TensorFlow or torch.profiler)
    shrunk: dict[str, tuple] = field(default_factory=dict)
    quiet: bool = False  # no per-path progress lines (a capacity probe)
    service_workers: int = 2  # --service-workers: the tf-data-service path's own workers
    dispatcher: str | None = None  # --dispatcher grpc://HOST:PORT: an existing tf.data service (starts nothing)
    service_mode: str = "off"  # --service-mode: off (each worker the whole source) or dynamic (split between them)
    ray_cpus: int = 2  # --ray-cpus: CPUs of the ray-data path's own Ray cluster
    ray_address: str | None = None  # --ray-address HOST:PORT: an existing Ray cluster (starts nothing)
    ray_prefetch: int = 2  # --ray-prefetch: batches each rank's Ray Data iterator fetches ahead
    ray_block_batches: int = 8  # --ray-block-batches: batches per block of the ray-data pipeline (one Ray task each)
    real_data: bool = False  # --real-data: every way to feed the model from --data, and the cores each needs
    # --interleave N: each path again in N runs alternating with the baseline (harness/interleave.py); None:
    # INTERLEAVE_GPU where a GPU is used, else 0 (apply_defaults)
    interleave: int | None = None

    @property
    def stand_in(self) -> bool:
        """No ResNet-50 to train: --input-only's scalar or an emulated device stands in for the model."""
        return self.input_only or self.model == "emulated"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shrunk"] = {k: list(v) for k, v in self.shrunk.items()}
        return d


def apply_defaults(cfg: BenchConfig, gpus: int) -> list[str]:
    """Fill unset fields for a machine with `gpus` GPUs; returns lines saying what was shrunk and why."""
    has_gpu = gpus > 0
    notes = []
    defaults = GPU_DEFAULTS if has_gpu else CPU_DEFAULTS
    if cfg.model == "emulated":
        from core.emulate import Emulation

        emu = Emulation.of(cfg.emulate, cfg.emulate_rate)
        cfg.emulation = emu.to_dict()
        defaults = {**GPU_DEFAULTS, **({} if has_gpu else EMULATED_DEFAULTS)}
        if cfg.batch is None:
            cfg.batch = emulated_batch(emu.images_per_sec)
    elif cfg.input_only and not has_gpu:
        # No model: steps take a millisecond or less, so the GPU schedule (20 warm-up, 7 x 100 timed) costs
        # seconds and gives windows long enough to time; only the images and the batch shrink.
        defaults = {**CPU_DEFAULTS, **{k: GPU_DEFAULTS[k] for k in ("warmup_steps", "steps", "repeats")}}
    for key, value in defaults.items():
        if getattr(cfg, key) is None:
            setattr(cfg, key, value)
            if not has_gpu and GPU_DEFAULTS[key] != value and cfg.model != "emulated":
                cfg.shrunk[key] = (GPU_DEFAULTS[key], value)
    if cfg.interleave is None:
        cfg.interleave = INTERLEAVE_GPU if has_gpu and not cfg.find_capacity else 0
    if cfg.num_gpus is None:
        # Every GPU: the multi-device trainer is the point. Without one, two CPU towers, so the
        # replicated / parameter-server code runs even on the 2-core reference machine.
        cfg.num_gpus = gpus if has_gpu else min(2, os.cpu_count() or 1)
    if cfg.data_format is None:
        cfg.data_format = "NCHW" if has_gpu else "NHWC"
    if cfg.dali_device is None:
        cfg.dali_device = "gpu" if has_gpu else "cpu"
    if cfg.dali_threads is None:
        # The cores each device can have; a GPU pipeline needs a few for reading and nvJPEG's host stage
        # (DALI's examples use 4), a CPU one decodes on all of its share.
        share = max(1, (os.cpu_count() or 1) // max(1, cfg.num_gpus))
        cfg.dali_threads = min(4, share) if cfg.dali_device == "gpu" else share
    if cfg.shrunk:
        what = ", ".join(f"{k.replace('_', '-')} {a}->{b}" for k, (a, b) in cfg.shrunk.items())
        notes.append(
            f"no GPU found: towers run on CPU devices, and defaults shrink ({what}) so the run takes minutes, "
            "not hours; pass the flags to override"
        )
    return notes


def emulated_batch(rate: float) -> int:
    """A batch per device that makes an emulated step last about EMULATED_STEP_S at `rate` images/s.

    Long enough that the trainer's own time between steps is a small part of a
    step, short enough that a probe of a few dozen steps takes seconds.
    """
    return int(min(512, max(8, round(rate * EMULATED_STEP_S / 8) * 8)))
