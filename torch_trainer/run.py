"""Train ResNet-50 on every rank, fed by one input path at a time, and report one combined result.

Two sides:

- `main(cfg, args)` is `bench_input.py --framework torch`: it refuses flags
  that mean nothing in PyTorch, starts torchrun (launch.py), and prints and
  writes the report rank 0 combined.
- `python -m torch_trainer.run` is what torchrun starts on each rank: DDP
  (NCCL on GPUs, gloo on CPU devices), the model, and the measured loop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time

from core.config import BenchConfig, apply_defaults
from core.errors import ConfigError, FeedbenchError, InputError
from core.gpus import unseen_gpus
from core.registry import BASELINE, feeder_line

# How to get a torch that sees the GPUs: PyPI's Linux wheels are CUDA builds (scripts/setup_env.sh).
TORCH_FIX = "install the CUDA build (pip install torch==2.14.1 from PyPI, or run `make install` again)"

HALF_CUDA, HALF_CPU = "float16", "bfloat16"  # --use-fp16: autocast's half type on each kind of device


# --- the parent: bench_input.py --framework torch ------------------------------------------------


def refuse(cfg: BenchConfig, args: argparse.Namespace) -> None:
    """One ConfigError line for a flag that has no meaning (or no implementation) with --framework torch."""
    if cfg.variable_update == "parameter_server":
        raise ConfigError(
            "--variable-update parameter_server: PyTorch's DistributedDataParallel all-reduces gradients "
            "(replicated); there is no parameter server with --framework torch"
        )
    if cfg.variable_update == "horovod":
        raise ConfigError("--variable-update horovod: --framework torch uses torchrun and DistributedDataParallel")
    if cfg.ps_device != "cpu":
        raise ConfigError("--ps-device: there is no parameter server with --framework torch")
    if cfg.transport != "ipc":
        raise ConfigError(
            "--transport shm: the PyTorch ranks' own producers use ipc; start shm producers yourself and give --endpoint shm://NAME"
        )
    if cfg.find_capacity:
        raise ConfigError("--find-capacity searches with the TensorFlow trainer; drop --framework torch for it")


def describe_machine(torch_mod, bandwidth: bool = False) -> dict:
    """The machine, for the report; `bandwidth`: also the pinned and pageable copy bandwidth to GPU 0 (2 s)."""
    gpus = [torch_mod.cuda.get_device_name(i) for i in range(torch_mod.cuda.device_count())]
    extra = {}
    if gpus and bandwidth:
        from torch_trainer.bandwidth import copy_gbps

        # The ceiling of every path that copies batches to the device (about 2 s to measure).
        extra["h2d_gbps"] = {"pinned": copy_gbps(256_000_000, True), "pageable": copy_gbps(256_000_000, False)}
    return {
        **extra,
        "gpus": gpus,
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "torch": torch_mod.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
    }


def rank_table(results: dict[str, dict]) -> str:
    """Per rank: images/s and input wait, so a straggling rank is named."""
    from tabulate import tabulate

    rows = []
    for path, r in results.items():
        for p in r.get("ranks", []):
            share = p["input_wait_share"]
            rows.append(
                [
                    path,
                    p["rank"],
                    p["host"],
                    p["device"],
                    f"{p['images_per_sec']['median']:.1f}",
                    "n/a" if share is None else f"{100 * share:.0f}%",
                    f"{p['input_wait_ms_mean']:.1f}" if p["input_wait_ms_mean"] is not None else "n/a",
                ]
            )
    headers = ["input path", "rank", "host", "device", "images/s", "input wait", "wait ms/step"]
    return tabulate(rows, headers=headers, disable_numparse=True)


def main(cfg: BenchConfig, args: argparse.Namespace, check_machine, sweep: tuple | None = None) -> int:
    """bench_input.py --framework torch, after its flag checks: launch the ranks on torchrun, then report.

    `check_machine(cfg, gpus)` is the CLI's own check of devices and memory; `sweep` is
    (the config before defaults, the grid) for --sweep: one torchrun launch per grid point.
    """
    from torch_trainer.launch import Nodes

    refuse(cfg, args)
    nodes = Nodes(args.nnodes, args.node_rank, args.master_addr, args.master_port)
    nodes.check()
    import torch

    gpus = torch.cuda.device_count()
    problem = unseen_gpus("torch", gpus, torch.version.cuda, TORCH_FIX)
    if problem:  # never a silent run on the host of a GPU machine
        raise ConfigError(problem)
    layout = channels_last_default(cfg, gpus)
    notes = apply_defaults(cfg, gpus) + ([layout] if layout else [])
    if gpus and cfg.num_gpus > gpus:
        check_machine(cfg, gpus)  # refuses: more ranks than GPUs
    if sweep is None:
        check_memory(cfg, gpus)
    else:  # every grid point, before the first starts
        import copy

        from profiler.sweep import points

        for point in points(*sweep):
            point = copy.deepcopy(point)
            apply_defaults(point, gpus)
            check_memory(point, gpus)
    check_machine(cfg, gpus)
    if sweep is not None:
        return _sweep(*sweep, gpus, nodes, args.out or "results")
    for note in notes:
        print(f"note: {note}")
    world = cfg.num_gpus * nodes.nnodes
    print(_header(cfg, torch.__version__, gpus, nodes), flush=True)
    if cfg.loader and (feeder := feeder_line(cfg, "torch")):
        print(feeder, flush=True)
    started = time.time()
    doc = _launch(cfg, nodes)
    if doc is None:
        return 0 if nodes.node_rank != 0 else 2
    results: dict[str, dict] = doc["paths"]
    _print_report(cfg, results, world)
    device = {**doc["device"], "ranks": world, "nodes": nodes.nnodes}
    config = {**cfg.to_dict(), "framework": "torch", "nnodes": nodes.nnodes}
    if args.out:
        from core import registry
        from profiler.sweep import rows_of, write_results

        rows = rows_of([{"config": config, "paths": results}])
        files = write_results(args.out, {"framework": "torch", "device": device, "rows": rows}, registry.names("torch"))
        print("\n" + "\n".join(f"wrote {f}" for f in files))
    if cfg.json_path:
        from profiler import report

        base = results.get(BASELINE, {}).get("images_per_sec")
        report.write_json(
            cfg.json_path,
            {
                "framework": "torch",
                "config": config,
                "device": device,
                "reference": {"baseline": BASELINE, "baseline_images_per_sec": base},
                "started": started,
                "paths": results,
            },
        )
        print(f"\nwrote {cfg.json_path}")
    return 0


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

    from core import registry
    from runner import memory

    fed = not cfg.endpoint and any(registry.get("torch", p).needs_producers for p in cfg.paths)
    est = memory.estimate(
        cfg.batch, cfg.image_size, cfg.num_gpus, gpus,
        stand_in=cfg.input_only or cfg.model == "emulated", half=cfg.use_fp16,
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


def model_words(cfg: BenchConfig, rates: list[float] | None = None) -> str:
    """What the ranks train: ResNet-50, or an emulated device labelled with its rate and the rate's source."""
    if cfg.model == "emulated" and cfg.emulation:
        e = cfg.emulation
        rate = ", ".join(f"{r:.0f}" for r in rates) if rates else f"{e['images_per_sec']:.0f}"
        return f"emulated {e['device']} ({rate} img/s per device) [source: {e['source']}]"
    return f"ResNet-50 v{cfg.resnet_version}{' (input only)' if cfg.input_only else ''}"


def _header(cfg: BenchConfig, version: str, gpus: int, nodes) -> str:
    world = cfg.num_gpus * nodes.nnodes
    kind = "GPU" if gpus else "CPU"
    half = f", AMP {HALF_CUDA if gpus else HALF_CPU}" if cfg.use_fp16 else ""
    compiled = ", torch.compile" if cfg.use_xla_compile else ""
    ddp = f", DDP {'nccl' if gpus else 'gloo'}" if world > 1 and not cfg.input_only else ""
    return (
        f"feedbench (PyTorch {version}): {model_words(cfg)}, {world} {kind} rank(s)"
        f"{f' on {nodes.nnodes} nodes' if nodes.nnodes > 1 else ''} x batch {cfg.batch}, "
        f"{cfg.image_size}x{cfg.image_size} {cfg.data_format}{half}{compiled}{ddp}, "
        f"{cfg.warmup_steps} warm-up + {cfg.repeats} x {cfg.steps} steps"
    )


def _launch(cfg: BenchConfig, nodes) -> dict | None:
    """One torchrun launch of every path in `cfg`; rank 0's document, or None on other nodes.

    Raises InputError with the line that explains a failure (a rank's own, or how a rank died).
    The run's folder is removed on every exit, Ctrl-C and SIGTERM included.
    """
    import shutil

    from runner import shutdown
    from torch_trainer.launch import launch

    if cfg.max_msg_size is None:
        cfg.max_msg_size = expected_message_size(cfg.batch, cfg.image_size)
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


def _print_report(cfg: BenchConfig, results: dict[str, dict], world: int) -> None:
    """Ratios and verdicts into `results`; the tables on stdout."""
    from profiler import report
    from profiler.verdict import verdicts_text

    report.add_ratios(results)
    print()
    print(report.table(results, world, cfg.input_only))
    if world > 1:
        print()
        print(rank_table(results))
        for path, r in results.items():
            s = r.get("straggler")
            if s and s["input_wait_share"] and s["input_wait_share"] >= 0.05:
                print(f"{path}: rank {s['rank']} ({s['host']}) straggles: {s['why']}")
    if cfg.telemetry:
        print()
        print(verdicts_text(results))


def _sweep(base: BenchConfig, grid: dict, gpus: int, nodes, out: str) -> int:
    """--sweep: every grid point is one torchrun launch of its paths; results.{json,csv,md,png} in `out`."""
    import os

    import torch

    from core import registry
    from profiler import report
    from profiler.sweep import points, rows_of, write_results
    from profiler.verdict import add_verdicts

    configs = points(base, grid)
    runs = []
    started = time.time()
    for i, cfg in enumerate(configs, 1):
        layout = channels_last_default(cfg, gpus)
        notes = apply_defaults(cfg, gpus) + ([layout] if layout else [])
        if i == 1:
            for note in notes:
                print(f"note: {note}")
        print(f"[{i}/{len(configs)}] {_header(cfg, torch.__version__, gpus, nodes)}", flush=True)
        doc = _launch(cfg, nodes)
        if doc is None:
            continue
        results = doc["paths"]
        report.add_ratios(results)
        if cfg.telemetry:
            add_verdicts(results)
        runs.append({"config": {**cfg.to_dict(), "framework": "torch", "nnodes": nodes.nnodes}, "paths": results})
    if nodes.node_rank != 0:
        return 0
    doc = {
        "framework": "torch",
        "grid": dict(grid),
        "device": {**describe_machine(torch), "nodes": nodes.nnodes},
        "started": started,
        "title": f"PyTorch, {model_words(configs[0], grid.get('emulate_rate'))}, {configs[0].image_size}px",
        "rows": rows_of(runs),
        "runs": runs,
    }
    files = write_results(out, doc, registry.names("torch"))
    print()
    print(open(os.path.join(out, "results.md")).read())
    print("\n".join(f"wrote {f}" for f in files))
    return 0


def expected_message_size(batch: int, image_size: int) -> int:
    """The default receive cap (consumers.expect.receive_cap): at least 1 GiB, so a batch of another size
    is received and reported as a mismatch, not dropped by ZMQ without a word (ZMQ_MAXMSGSIZE)."""
    from consumers.expect import receive_cap

    return receive_cap(batch, image_size)


# --- each rank: python -m torch_trainer.run (started by torchrun) --------------------------------


def build(cfg: BenchConfig, device, world: int):
    """(model as trained, optimizer, grad scaler or None, autocast dtype or None) for one path's run."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_trainer import models

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
    # The linear scaling rule (0.1 per 256 images), as the TensorFlow trainer: tiny CPU batches would diverge.
    lr = 0.1 * cfg.batch * world / 256
    # Fused on CUDA: one kernel for the update, and GradScaler hands it the scale and the inf check on the
    # device (with an unfused optimizer, GradScaler.step reads found_inf with .item(): a sync every step).
    fused = device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4, fused=fused or None)
    if cfg.use_xla_compile:
        model = torch.compile(model)  # --use-xla-compile: PyTorch's compiler; compiling happens in the warm-up
    amp = None
    scaler = None
    if cfg.use_fp16:
        amp = torch.float16 if device.type == "cuda" else torch.bfloat16
        if amp is torch.float16:
            scaler = torch.amp.GradScaler("cuda")  # float16 needs loss scaling; bfloat16 has float32's range
    return model, opt, scaler, amp


def train_path(cfg: BenchConfig, name: str, ctx) -> dict:
    """Warm-up + steps x repeats on this rank, fed by path `name`; this rank's figures."""
    import torch
    import torch.nn.functional as F

    from core import registry
    from torch_trainer.measure import RankTimer, synchronize
    from torch_trainer.models import normalize

    model, opt, scaler, amp = build(cfg, ctx.device, ctx.world)
    path = registry.get("torch", name)(cfg)
    where = place(path, ctx)
    with open(os.path.join(ctx.result_dir, f"at-rank{ctx.rank}.txt"), "w") as f:
        f.write(where + "\n")  # what this rank was doing, should it die without a word
    timer = RankTimer(cfg.warmup_steps, cfg.steps, cfg.repeats)
    channels_last = cfg.data_format == "NHWC"
    show = ctx.rank == 0 and cfg.telemetry
    cuda = ctx.device.type == "cuda"
    # DDP's gradients are views of its buckets: zero them in place, or every step re-creates them as copies.
    bucket_views = ctx.world > 1 and not cfg.input_only
    sync_debug = os.environ.get(SYNC_DEBUG_ENV) if cuda else None  # python -m torch_trainer.gpu_check

    def train_step(x, labels):
        """Forward, backward and the optimizer's step on one normalized batch; the loss."""
        with torch.autocast(ctx.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            out = model(x)
        stand_in = cfg.input_only or cfg.model == "emulated"  # no classifier: a scalar to train
        loss = out.float().mean() if stand_in else F.cross_entropy(out.float(), labels)
        opt.zero_grad(set_to_none=not bucket_views)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    try:
        path.open(ctx)
        for step in range(timer.needed):
            if step == cfg.warmup_steps:
                getattr(path, "measure_start", lambda: None)()
                if sync_debug:  # after the warm-up: cuDNN's autotuning and DDP's first steps may synchronize
                    torch.cuda.set_sync_debug_mode(sync_debug)
            t0 = time.perf_counter()
            before = timer.mark(cuda)  # on the step's stream: done when the previous step's work is
            images, labels = path.next()
            after = timer.mark(cuda)  # done when the batch is there too: the device waited in between
            t1 = time.perf_counter()
            loss = train_step(normalize(images, channels_last), labels)
            timer.losses.append(loss.detach())
            if timer.window_end(step):
                with allowed_sync(sync_debug):
                    synchronize(ctx.device)  # a timed window ends when the device has done its work
            timer.starts.append(t0)
            timer.waits.append(t1 - t0)  # the host's wait; on a GPU replaced by the device's at the window's end
            timer.device_marks.append((before, after))
            timer.ends.append(time.perf_counter())
            if timer.window_end(step):
                timer.close_window(step)
                if show and step >= cfg.warmup_steps:
                    rate = cfg.batch * cfg.steps / timer.window_walls[-1]
                    print(
                        f"  window {len(timer.window_walls)}/{cfg.repeats}: {rate:.1f} images/s on rank 0", flush=True
                    )
            path.check()
        if sync_debug:
            torch.cuda.set_sync_debug_mode(0)
        getattr(path, "measure_end", lambda: None)()
        synchronize(ctx.device)
        figures = timer.figures()
        figures["stages"] = path.stage_figures()
        figures.update(path.accounting())
        figures["decoded_on"] = getattr(path, "decoded_on", None)  # where DALI decoded, for the dali paths
        figures["batches_trained"] = timer.needed
        if cfg.profile_dir:  # untimed steps after every figure is taken: the trace changes none of them
            from torch_trainer.tracing import ProfileSteps

            profiled = ProfileSteps(cfg.profile_dir, name, ctx.rank, ctx.device)
            written = profiled.run(path.next, lambda im: normalize(im, channels_last), train_step, path.check)
            if ctx.rank == 0 and written:
                print(f"  profile: {written[0]}{' (and one per rank)' if ctx.world > 1 else ''}", flush=True)
    except (FeedbenchError, TimeoutError, RuntimeError, ValueError) as e:
        # A producer that died, a receive that timed out, a batch of the wrong shape: one line
        # naming the path and its endpoint (ValueError: the wire's and the receiver's batch errors).
        raise InputError(f"{where}: {detail(e, name)}") from e
    finally:
        if sync_debug:
            torch.cuda.set_sync_debug_mode(0)  # closing a path may synchronize, deliberately
        path.close()
    return figures


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


def _mean_known(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _merge_stages(ranks: list[dict]) -> dict:
    """The telemetry stages of all ranks as one: queue figures averaged, wire and producer rates summed."""
    out: dict = {"queue": None, "staging": None, "wire": None, "producers": None}
    qs = [r["stages"]["queue"] for r in ranks if r["stages"].get("queue")]
    if qs:
        out["queue"] = {k: (qs[0][k] if k == "capacity" else sum(q[k] for q in qs) / len(qs)) for k in qs[0]}
    ws = [r["stages"]["wire"] for r in ranks if r["stages"].get("wire")]
    if ws:
        out["wire"] = {
            "messages_per_sec": sum(w["messages_per_sec"] for w in ws),
            "bytes_per_sec": sum(w["bytes_per_sec"] for w in ws),
            "latency_ms_mean": _mean_known(w["latency_ms_mean"] for w in ws),
            "recv_wait_ms_mean": _mean_known(w["recv_wait_ms_mean"] for w in ws),
            "source": ws[0]["source"],
        }
    ps = [r["stages"]["producers"] for r in ranks if r["stages"].get("producers")]
    if ps:
        shares = [p["send_wait_share"] for p in ps if p["send_wait_share"] is not None]
        out["producers"] = {
            "source": ps[0]["source"],
            "count": sum(p["count"] for p in ps),
            "images_per_sec": sum(p["images_per_sec"] for p in ps),
            "send_latency_ms": sum(p["send_latency_ms"] for p in ps) / len(ps),
            "send_wait_share": sum(shares) / len(shares) if shares else None,
            "per_producer": [row for p in ps for row in p["per_producer"]],
        }
    return out


def combined(cfg: BenchConfig, name: str, ranks: list[dict], amp) -> dict:
    """Rank 0: the path's result in the shared schema, from every rank's figures."""
    from torch_trainer.measure import combine

    result = combine(ranks, cfg.batch, cfg.steps)
    result["bytes_per_image"] = cfg.image_size * cfg.image_size * 3 + 4
    from core import registry

    result["input"] = registry.get("torch", name)(cfg).describe()  # the verdict's words for this path
    result["amp"] = str(amp).replace("torch.", "") if amp is not None else None
    if cfg.model == "emulated":
        result["emulated"] = dict(cfg.emulation)  # every emulated figure carries its label
    if any("producers" in r for r in ranks):
        result["producers"] = [{"rank": r["rank"], **row} for r in ranks for row in r.get("producers", [])]
    if any("batches_pulled" in r for r in ranks):
        result["batches_pulled"] = sum(r.get("batches_pulled", 0) for r in ranks)
        result["batches_pulled_per_rank"] = [r.get("batches_pulled", 0) for r in ranks]
    result["batches_trained"] = sum(r["batches_trained"] for r in ranks)
    if any(r.get("decoded_on") for r in ranks):  # every result says where DALI decoded
        result["decoded_on"] = [{"rank": r["rank"], "on": r.get("decoded_on")} for r in ranks]
    if cfg.telemetry:
        result["telemetry"].update(_merge_stages(ranks))
        result["telemetry"]["trainer"] = {
            "images_per_sec": result["images_per_sec"]["median"],
            "images_per_sec_per_device": result["images_per_sec_per_device"]["median"],
            "step_time_ms": result["step_time_ms"],
        }
    else:
        result.pop("telemetry")
    return result


def worker(argv: list[str] | None = None) -> int:
    """One rank, as torchrun starts it: train every path of the config, gather, rank 0 writes the result."""
    from runner import shutdown
    from torch_trainer.launch import follow_launcher

    # SIGTERM from torchrun (another rank failed, the run was stopped) stops this rank's producers too;
    # quietly: bench_input.py says what happened, in one line.
    shutdown.install(announce=False)
    follow_launcher()  # and so does the launcher's death
    p = argparse.ArgumentParser(prog="python -m torch_trainer.run")
    p.add_argument("--config", required=True)
    p.add_argument("--result-dir", required=True)
    a = p.parse_args(argv)
    raw = json.load(open(a.config))
    raw["shrunk"] = {k: tuple(v) for k, v in raw.get("shrunk", {}).items()}
    cfg = BenchConfig(**{k: v for k, v in raw.items() if k in BenchConfig.__dataclass_fields__})

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    import torch
    import torch.distributed as dist

    from torch_trainer.inputs.base import RankContext, cpu_threads

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or cpu_threads(local_world)))
    torch.manual_seed(0)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    links = host_to_device(device, rank, world, dist)  # before training, one device at a time
    results: dict[str, dict] = {}
    rank_dir = os.path.join(a.result_dir, f"r{rank}")
    os.makedirs(rank_dir, exist_ok=True)
    host = socket.gethostname()
    dev_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    code = 0
    try:
        for name in cfg.paths:
            if rank == 0:
                print(f"- {name} ...", flush=True)
            t0 = time.perf_counter()
            ctx = RankContext(rank, world, local_rank, device, rank_dir, a.result_dir)
            figures = train_path(cfg, name, ctx)
            figures.update(rank=rank, host=host, device=dev_name)
            gathered: list = [None] * world
            dist.all_gather_object(gathered, figures)
            if rank == 0:
                amp = build_amp(cfg, device)
                results[name] = combined(cfg, name, gathered, amp)
                r = results[name]
                print(f"  {r['images_per_sec']['median']:.1f} images/s ({time.perf_counter() - t0:.0f} s)", flush=True)
        if rank == 0:
            from core.atomic import atomic_write

            doc = {"device": {**describe_machine(torch), **({"h2d_pinned_gbps": links} if links else {})},
                   "paths": results}  # fmt: skip
            atomic_write(os.path.join(a.result_dir, "result.json"), json.dumps(doc))
    except Exception as e:  # a producer that died, a receive timeout, an import that failed
        if shutdown.stopping():  # being stopped: the watcher exits once the producers are gone
            threading.Event().wait()
        if isinstance(e, FeedbenchError):
            _error(a.result_dir, rank, str(e), e.exit_code)
            code = e.exit_code
        else:
            _error(a.result_dir, rank, f"rank {rank}: {type(e).__name__}: {e}", 1)
            code = 1
    finally:
        shutdown.run_cleanups()
        if code == 0:
            dist.destroy_process_group()
    if code:
        os._exit(code)  # without waiting for the other ranks: torchrun stops them
    return 0


def host_to_device(device, rank: int, world: int, dist) -> list[dict] | None:
    """Pinned host -> device copy bandwidth of every rank's device, measured in turn; None without GPUs.

    In turn, so each figure is the device's own link, not its share of a
    contended one. Rank 0 prints them; the result keeps them (`device.h2d_pinned_gbps`).
    """
    if device.type != "cuda":
        return None
    import torch

    from torch_trainer.bandwidth import copy_gbps

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


def build_amp(cfg: BenchConfig, device):
    import torch

    if not cfg.use_fp16:
        return None
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def _error(result_dir: str, rank: int, message: str, code: int) -> None:
    """This rank's one line and exit code, for bench_input.py (torch_trainer.launch.failure_lines)."""
    line = message.strip().splitlines()[0] if message.strip() else "failed"
    from core.atomic import atomic_write

    atomic_write(os.path.join(result_dir, f"error-rank{rank}.json"), json.dumps({"line": line, "code": code}))


if __name__ == "__main__":
    sys.exit(worker())
