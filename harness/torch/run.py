"""Each rank, as torchrun starts it (`python -m harness.torch.run`): DDP, the model, the measured loop.

The parent side (`bench_input.py --framework torch`) is the harness with the
PyTorch plugin (harness/torch/plugin.py), which launches this on every rank.
Each rank trains every path of the configuration in turn (NCCL on GPUs,
gloo on CPU devices); rank 0 gathers every rank's figures and writes one
result per path, in the same schema as the TensorFlow trainer's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

from core.config import BenchConfig
from core.errors import FeedbenchError, InputError
from profiler.telemetry import stage_figures
from profiler.training import base_learning_rate, warmup_factor


def build(cfg: BenchConfig, device, world: int):
    """(model as trained, optimizer, grad scaler or None, autocast dtype or None) for one path's run."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from harness.torch.measure import INITIAL_SCALE
    from models import torch as models

    if cfg.input_only:
        model = models.InputOnly()
    elif cfg.model == "emulated":
        model = models.EmulatedDevice(float(cfg.emulation["images_per_sec"]))  # filled by apply_defaults
    else:
        model = models.resnet50(cfg.resnet_version)
    model = model.to(device)
    channels_last = cfg.data_format == "NHWC"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if world > 1 and not cfg.input_only:
        # Gradients live in DDP's all-reduce buckets: no copy into and out of them every step.
        model = DDP(
            model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
        )  # fmt: skip
    # The linear scaling rule (0.1 per 256 images) unless --learning-rate, as the TensorFlow trainer; the
    # step warms it up (profiler/training.py warmup_factor).
    lr = base_learning_rate(cfg.learning_rate, cfg.batch * world)
    # Fused on CUDA: one kernel for the update, and GradScaler hands it the scale and the inf check on the
    # device (with an unfused optimizer, GradScaler.step reads found_inf with .item(): a sync every step).
    fused = device.type == "cuda"
    if cfg.stand_in:
        opt = models.StandInSGD(model.parameters(), lr)
    else:
        opt = sgd(model.parameters(), lr, fused)
    if cfg.use_xla_compile:
        model = torch.compile(model)  # --use-xla-compile: PyTorch's compiler; compiling happens in the warm-up
    amp = None
    scaler = None
    if cfg.use_fp16:
        amp = torch.float16 if device.type == "cuda" else torch.bfloat16
        if amp is torch.float16 and not cfg.stand_in:  # a stand-in's scalar needs no loss scaling
            # float16 needs loss scaling; bfloat16 has float32's range.
            scaler = torch.amp.GradScaler("cuda", init_scale=INITIAL_SCALE)
    return model, opt, scaler, amp


def sgd(params, lr: float, fused: bool):
    """SGD with momentum 0.9 and weight decay 1e-4, its momentum buffers made (zeros) before the first step.

    A fused SGD under a GradScaler (torch 2.11 to 2.14 at least) makes its momentum buffers from uninitialized
    memory when the first steps are skipped, as a float16 run's first steps are while the scaler finds its
    scale: the first update then throws the weights to 1e24 or beyond, and every loss after it is non-finite
    (every ResNet-50 run on the H200, 2026-11-26 and 28). Buffers of zeros from the start give the same steps
    as unfused SGD, skipped ones included (a zero buffer's first update is the gradient, as unfused SGD's).
    """
    import torch

    params = list(params)
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4, fused=fused or None)
    for p in params:
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return opt


def train_path(cfg: BenchConfig, name: str, ctx) -> dict:
    """Warm-up + steps x repeats on this rank, fed by path `name`; this rank's figures."""
    import torch

    from consumers import declared
    from harness.torch.measure import RankTimer, synchronize
    from profiler.cpu import input_cores, input_snapshot

    model, opt, scaler, amp = build(cfg, ctx.device, ctx.world)
    path = declared.get("torch", name)(cfg)
    where = place(path, ctx)
    with open(os.path.join(ctx.result_dir, f"at-rank{ctx.rank}.txt"), "w") as f:
        f.write(where + "\n")  # what this rank was doing, should it die without a word
    timer = RankTimer(cfg.warmup_steps, cfg.steps, cfg.repeats)
    sync_debug = os.environ.get(SYNC_DEBUG_ENV) if ctx.device.type == "cuda" else None  # harness.torch.gpu_check
    prepared = _preparer(cfg)
    train_step = _stepper(cfg, ctx, model, opt, scaler, amp)
    try:
        timer.opened = time.perf_counter()  # the path's start, for its time to the first batch
        path.open(ctx)
        first = _run_steps(
            cfg, ctx, path, timer, lambda images, labels: train_step(prepared(images), labels), sync_debug,
            _emulated(model),
        )  # fmt: skip
        window = (first, path.counters())  # the stage contract's raw state at the measured window's edges
        synchronize(ctx.device)
        figures = _path_figures(path, timer, amp, window, train_step.scales)
        figures["input_cpu"] = input_cores(timer.input_cpu, input_snapshot())
        if cfg.profile_dir:  # untimed steps after every figure is taken: the trace changes none of them
            _profile(cfg, name, ctx, path, prepared, train_step)
    except (FeedbenchError, TimeoutError, RuntimeError, ValueError) as e:
        # A producer that died, a receive that timed out, a batch of the wrong shape: one line
        # naming the path and its endpoint (ValueError: the wire's and the receiver's batch errors).
        raise InputError(f"{where}: {detail(e, name)}") from e
    finally:
        if sync_debug:
            torch.cuda.set_sync_debug_mode(0)  # closing a path may synchronize, deliberately
        path.close()
    return figures


def _preparer(cfg: BenchConfig):
    """What the host does to a batch before the model: normalize it, unless the device is emulated."""
    from models.torch import normalize

    channels_last = cfg.data_format == "NHWC"

    def prepared(images):
        # An emulated device's rate includes all of its work: the host does not normalize for it.
        return images if cfg.model == "emulated" else normalize(images, channels_last)

    return prepared


def _stepper(cfg: BenchConfig, ctx, model, opt, scaler, amp):
    """The training step every path feeds: forward, backward and the optimizer's step on one batch."""
    import torch
    import torch.nn.functional as F

    # DDP's gradients are views of its buckets: zero them in place, or every step re-creates them as copies.
    bucket_views = ctx.world > 1 and not cfg.input_only
    groups = getattr(opt, "param_groups", None) or [opt.__dict__]  # StandInSGD keeps its rate as `lr`
    base = groups[0]["lr"]
    done = [0]

    def train_step(x, labels):
        """Forward, backward and the optimizer's step on one normalized batch, at the warmed-up rate; the loss."""
        if done[0] <= cfg.warmup_steps:
            for g in groups:
                g["lr"] = base * warmup_factor(done[0], cfg.warmup_steps)
        done[0] += 1
        with torch.autocast(ctx.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            out = model(x)
        loss = out.float().mean() if cfg.stand_in else F.cross_entropy(out.float(), labels)
        opt.zero_grad(set_to_none=not bucket_views)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            # The scale after the update, on the device (no sync): a skipped step lowered it (read at the end).
            train_step.scales.append(scaler._get_scale_async().clone())
        else:
            loss.backward()
            opt.step()
        return loss

    train_step.scales = []  # a step that skipped its update lowered the scale (profiler/training.py skipped_steps)
    return train_step


def _emulated(model):
    """The emulated device inside `model` (under DDP or torch.compile, whichever wraps it), or None."""
    from models.torch import EmulatedDevice

    return next((m for m in model.modules() if isinstance(m, EmulatedDevice)), None)


def _run_steps(cfg: BenchConfig, ctx, path, timer, step_on, sync_debug: str | None, emulated=None) -> dict | None:
    """Warm-up, then the timed windows: each step takes a batch from the path, the device's wait marked around it.

    Returns the path's `counters()` from just before the first timed step.

    An emulated device runs its step while the host goes on (models/torch.py): a window ends when its last
    step has, and the input wait is the device's own (how long it sat idle for each batch).
    """
    import torch

    from harness.torch.measure import synchronize
    from profiler.cpu import input_snapshot

    show = ctx.rank == 0 and cfg.telemetry
    cuda = ctx.device.type == "cuda"
    first = None
    for step in range(timer.needed):
        if step == cfg.warmup_steps:
            first = path.counters()
            timer.input_cpu = input_snapshot()  # the input side's CPU over the timed steps (profiler/cpu.py)
            if sync_debug:  # after the warm-up: cuDNN's autotuning and DDP's first steps may synchronize
                torch.cuda.set_sync_debug_mode(sync_debug)
        t0 = time.perf_counter()
        before = timer.mark(cuda)  # on the step's stream: done when the previous step's work is
        images, labels = path.next()
        after = timer.mark(cuda)  # done when the batch is there too: the device waited in between
        t1 = time.perf_counter()
        if step == 0:
            timer.first_batch_at = t1
        loss = step_on(images, labels)
        timer.losses.append(loss.detach())
        if timer.window_end(step):
            with allowed_sync(sync_debug):
                synchronize(ctx.device)  # a timed window ends when the device has done its work
            if emulated is not None:
                emulated.finish()
        timer.starts.append(t0)
        if emulated is not None:  # the emulated device's own idle time, not the host's time in next()
            timer.waits.append(emulated.idle)
            timer.device_marks.append((None, None))
        else:
            timer.waits.append(t1 - t0)  # the host's wait; on a GPU replaced by the device's at the window's end
            timer.device_marks.append((before, after))
        timer.ends.append(time.perf_counter())
        if timer.window_end(step):
            timer.close_window(step)
            if show and step >= cfg.warmup_steps:
                rate = cfg.batch * cfg.steps / timer.window_walls[-1]
                print(f"  window {len(timer.window_walls)}/{cfg.repeats}: {rate:.1f} images/s on rank 0", flush=True)
        path.check()
    if sync_debug:
        torch.cuda.set_sync_debug_mode(0)
    return first


def _path_figures(path, timer, amp, window: tuple[dict | None, dict | None], scales: list) -> dict:
    """This rank's figures: the timer's, the stages' (from the path's counters at `window`'s edges), how it trained.

    `scales`: the loss scaler's scale after each step (empty without one): which timed steps skipped their update.
    """
    figures = timer.figures([float(s) for s in scales[: timer.needed]])
    figures["stages"] = stage_figures(path, *window)
    figures["path_fields"] = path.rank_fields()  # merged over the ranks as the path's declaration says
    figures["batches_trained"] = timer.needed
    figures["amp"] = str(amp).replace("torch.", "") if amp is not None else None
    prefetch = getattr(path, "prefetch", None)  # a path with a queue: its occupancy at each step, for the timeline
    figures["queue_sizes"] = list(prefetch.queue_sizes) if prefetch is not None else []
    return figures


def _profile(cfg: BenchConfig, name: str, ctx, path, prepared, train_step) -> None:
    """A trace of a few untimed steps after the timed ones (torch.profiler), one file per rank."""
    from harness.torch.tracing import ProfileSteps

    profiled = ProfileSteps(cfg.profile_dir, name, ctx.rank, ctx.device)
    written = profiled.run(path.next, prepared, train_step, path.check)
    if ctx.rank == 0 and written:
        print(f"  profile: {written[0]}{' (and one per rank)' if ctx.world > 1 else ''}", flush=True)


SYNC_DEBUG_ENV = "FEEDBENCH_CUDA_SYNC_DEBUG"  # "warn" or "error": torch.cuda.set_sync_debug_mode in the timed steps


def allowed_sync(mode: str | None):
    """A deliberate host-device synchronization (a window's end) while sync debugging is on."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def allowed():
        torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    return allowed() if mode else contextlib.nullcontext()


def place(path, ctx) -> str:
    """`<path>: <endpoint(s)>`, or the path's name where it reads no endpoint: how its errors start."""
    endpoints = path.endpoints(ctx)
    return f"{path.name}: {', '.join(endpoints)}" if endpoints else path.name


def detail(e: BaseException, name: str) -> str:
    """An exception's message as one line, without the path's name or a re-raised traceback's class prefix.

    A DataLoader worker's exception comes back with the worker's traceback in its message; its
    last line is `module.Class: message`.
    """
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(e).__name__
    cls = type(e)
    for prefix in (f"{cls.__module__}.{cls.__qualname__}: ", f"{cls.__qualname__}: ", f"{name}: "):
        text = text.removeprefix(prefix)
    return text


def combined(cfg: BenchConfig, name: str, ranks: list[dict]) -> dict:
    """Rank 0: the path's result in the shared schema, from every rank's figures."""
    from consumers import declared
    from core.result_fields import merge_path_fields
    from harness.schedule import Schedule
    from harness.torch.measure import combine
    from harness.torch.tracing import PROFILED_STEPS
    from profiler.telemetry import add_common_fields, merge_rank_stages

    result = combine(ranks, cfg.batch, cfg.steps)
    result["amp"] = ranks[0]["amp"]
    # Which steps were timed: warm-up, then the windows; --profile's steps come after the last one.
    profiled = PROFILED_STEPS if cfg.profile_dir else 0
    result["schedule"] = Schedule(cfg.warmup_steps, cfg.steps, cfg.repeats, profiled=profiled).to_dict()
    path = declared.get("torch", name)
    # The path's own fields, each merged as its declaration says (consumers/<path>/path.py `fields`).
    result.update(merge_path_fields(path.declaration.result_fields(), ranks, name))
    result["batches_trained"] = sum(r["batches_trained"] for r in ranks)
    if any("input_cpu" in r for r in ranks):  # processes the ranks started and their input threads
        result["input_cpu"] = {"cores": sum(r["input_cpu"]["cores"] for r in ranks if "input_cpu" in r)}
    if cfg.telemetry:
        result["telemetry"].update(merge_rank_stages([r["stages"] for r in ranks]))
    else:
        result.pop("telemetry")
    # The fields every trainer's result has: size, batch, emulation label, the path's own words.
    add_common_fields(result, cfg, path(cfg).describe())
    return result


def worker(argv: list[str] | None = None) -> int:
    """One rank, as torchrun starts it: train every path of the config, gather, rank 0 writes the result."""
    from harness.torch.launch import follow_launcher
    from runner import shutdown

    # SIGTERM from torchrun (another rank failed, the run was stopped) stops this rank's producers too;
    # quietly: bench_input.py says what happened, in one line.
    shutdown.install(announce=False)
    follow_launcher()  # and so does the launcher's death
    result_dir, cfg = _worker_config(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import torch.distributed as dist

    device = _join_group(dist)
    links = host_to_device(device, rank, world, dist)  # before training, one device at a time
    code = 0
    try:
        _train_paths(cfg, result_dir, device, dist, links)
    except Exception as e:  # a producer that died, a receive timeout, an import that failed
        if shutdown.stopping():  # being stopped: the watcher exits once the producers are gone
            threading.Event().wait()
        if isinstance(e, FeedbenchError):
            _error(result_dir, rank, str(e), e.exit_code)
            code = e.exit_code
        else:
            from core.loader_spec import exception_words  # a DataLoader worker's error keeps its cause

            _error(result_dir, rank, f"rank {rank}: {exception_words(e)}", 1)
            code = 1
    finally:
        shutdown.run_cleanups()
        if code == 0:
            dist.destroy_process_group()
    if code:
        os._exit(code)  # without waiting for the other ranks: torchrun stops them
    return 0


def _worker_config(argv: list[str] | None) -> tuple[str, BenchConfig]:
    """The rank's result folder and the run's config, as the launcher wrote it."""
    p = argparse.ArgumentParser(prog="python -m harness.torch.run")
    p.add_argument("--config", required=True)
    p.add_argument("--result-dir", required=True)
    a = p.parse_args(argv)
    raw = json.load(open(a.config))
    raw["shrunk"] = {k: tuple(v) for k, v in raw.get("shrunk", {}).items()}
    return a.result_dir, BenchConfig(**{k: v for k, v in raw.items() if k in BenchConfig.__dataclass_fields__})


def _join_group(dist):
    """This rank's device, set up for training, and the process group joined (NCCL on GPUs, gloo on CPUs)."""
    import torch

    from core.machine import cpu_threads

    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or cpu_threads(local_world)))
    torch.manual_seed(0)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return device


def _train_paths(cfg: BenchConfig, result_dir: str, device, dist, links: list[dict] | None) -> None:
    """Every path of the config in turn (a path named twice runs twice: --interleave's alternation in one
    launch), each rank's figures gathered; rank 0 writes result.json."""
    import torch

    from consumers.torch_half import RankContext

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = device.type == "cuda"
    runs: list[dict] = []  # one result per entry of cfg.paths, in order: a path named twice ran twice
    rank_dir = os.path.join(result_dir, f"r{rank}")
    os.makedirs(rank_dir, exist_ok=True)
    host = socket.gethostname()
    dev_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    for name in cfg.paths:
        if rank == 0:
            print(f"- {name} ...", flush=True)
        t0 = time.perf_counter()
        ctx = RankContext(rank, world, local_rank, device, rank_dir, result_dir)
        figures = train_path(cfg, name, ctx)
        figures.update(rank=rank, host=host, device=dev_name)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, figures)
        if rank == 0:
            r = combined(cfg, name, gathered)
            runs.append(r)
            print(f"  {r['images_per_sec']['median']:.1f} images/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    if rank == 0:
        from core.atomic import atomic_write
        from harness.torch.plugin import describe_machine

        doc = {"device": {**describe_machine(torch), **({"h2d_pinned_gbps": links} if links else {})},
               "runs": runs}  # fmt: skip
        atomic_write(os.path.join(result_dir, "result.json"), json.dumps(doc))


def host_to_device(device, rank: int, world: int, dist) -> list[dict] | None:
    """Pinned host -> device copy bandwidth of every rank's device, measured in turn; None without GPUs.

    In turn, so each figure is the device's own link, not its share of a
    contended one. Rank 0 prints them; the result keeps them (`device.h2d_pinned_gbps`).
    """
    if device.type != "cuda":
        return None
    import torch

    from harness.torch.bandwidth import copy_gbps

    mine = None
    for r in range(world):
        dist.barrier()
        if r == rank:
            mine = copy_gbps(64_000_000, True, repeats=5, device=device)
    row = {"rank": rank, "host": socket.gethostname(), "device": torch.cuda.get_device_name(device), "gbps": mine}
    rows: list = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        for r in rows:
            print(
                f"  rank {r['rank']} ({r['host']}, {r['device']}): pinned host->device {r['gbps']:.1f} GB/s", flush=True
            )
    return rows


def _error(result_dir: str, rank: int, message: str, code: int) -> None:
    """This rank's one line and exit code, for bench_input.py (harness.torch.launch.failure_lines)."""
    line = message.strip().splitlines()[0] if message.strip() else "failed"
    from core.atomic import atomic_write

    atomic_write(os.path.join(result_dir, f"error-rank{rank}.json"), json.dumps({"line": line, "code": code}))


if __name__ == "__main__":
    sys.exit(worker())
