#!/usr/bin/env python3
"""feedbench: how much training throughput does an input pipeline cost?

Trains ResNet-50 on several devices, fed by each input path in turn, and
reports images/s against the same model fed by data already on the device:

    python bench_input.py                              # every path of the default run
    python bench_input.py --fake-location zmq-consume  # one path and the gpu baseline
"""

from __future__ import annotations

import argparse
import sys

from runner import shutdown  # light: signal handling goes in before TensorFlow or matplotlib start threads

MEMORY_SHARE = 16  # a run keeps about this many batches in memory (queues, staging, producer pools)


def main(argv: list[str] | None = None) -> int:
    """The CLI: every failure a user can cause is one line, `error: ...`, and exit code 2."""
    shutdown.install()
    from core.errors import FeedbenchError

    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except FeedbenchError as e:
        if shutdown.stopping():  # a signal is being handled: its line and exit code win over what it broke
            shutdown.wait_for_exit()
        return fail(str(e))


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as ConfigError: one line, exit code 2, like every other."""

    def error(self, message: str):
        from core.errors import ConfigError

        raise ConfigError(message)


def parse_args(argv: list[str], paths: dict):
    """The flags; input path names and their help come from the registry."""
    from core.cli_types import non_negative_int, positive_float, positive_int
    from core.registry import BASELINE
    from producers.commands import KINDS
    from runner import cluster_spec

    p = _Parser(prog="bench_input.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--framework", choices=("tf", "torch"), default="tf", help="the trainer: TensorFlow (default) or PyTorch"
    )
    listing = "; ".join(f"{n}: {c.summary}" for n, c in paths.items())
    default_run = ", ".join(n for n, c in paths.items() if c.in_default_run)
    p.add_argument(
        "--fake-location", choices=list(paths), metavar="PATH",
        help=f"run this input path and the {BASELINE} baseline (default: {default_run}). Paths: {listing}",
    )  # fmt: skip
    p.add_argument(
        "--num-gpus", type=positive_int, help="towers (devices); default: every GPU, or 2 CPU devices without a GPU"
    )
    p.add_argument("--batch", type=positive_int, help="batch size per device (default 64; 4 without a GPU)")
    p.add_argument("--image-size", type=positive_int, help="image height and width (default 224; 64 without a GPU)")
    p.add_argument(
        "--warmup-steps", type=non_negative_int, help="steps run before timing (default 20; 2 without a GPU)"
    )
    p.add_argument("--steps", type=positive_int, help="timed steps per repeat (default 100; 4 without a GPU)")
    p.add_argument(
        "--repeats", type=positive_int, help="timed repeats; the median is reported (default 7; 3 without a GPU)"
    )
    p.add_argument(
        "--variable-update", type=_variable_update, choices=("replicated", "parameter_server", *cluster_spec.MODES),
        default="replicated",
        help="how towers share variables: all-reduced copies per device, or one copy on --ps-device; "
        "distributed_*: across the tasks of a TensorFlow cluster (docs/cluster.md)",
    )  # fmt: skip
    p.add_argument("--ps-device", choices=("cpu", "gpu"), default="cpu", help="where parameter_server keeps variables")
    p.add_argument("--resnet-version", choices=("1", "1.5"), default="1.5", help="ResNet-50 v1 or v1.5 (stride in 3x3)")
    p.add_argument("--data-format", choices=("NCHW", "NHWC"), help="default NCHW on GPU, NHWC on CPU")
    p.add_argument("--use-fp16", action="store_true", help="fp16 compute, fp32 master weights, loss scaling")
    p.add_argument("--use-xla-compile", action="store_true", help="compile each tower's step with XLA")
    p.add_argument("--input-only", action="store_true", help="no model: each path's input ceiling")
    g = p.add_argument_group("emulated devices and capacity (docs/emulated.md)")
    g.add_argument(
        "--model", choices=("resnet50", "emulated"), default="resnet50",
        help="emulated: a device that consumes batches at a published rate, with no host CPU",
    )  # fmt: skip
    g.add_argument("--emulate", metavar="NAME", help="emulated device preset (A100, H100, H200; default H100)")
    g.add_argument(
        "--emulate-rate", type=positive_float, metavar="IMAGES_PER_SEC",
        help="emulated rate per device (a list under --sweep)",
    )  # fmt: skip
    g.add_argument(
        "--find-capacity", action="store_true",
        help="per path, search the highest demand it sustains at >= 97%% of the emulated baseline",
    )  # fmt: skip
    g.add_argument(
        "--bench", action="store_true",
        help="what `make bench` runs: every path on the real model; without a GPU, then every path's capacity "
        "against emulated H100s (or --emulate NAME)",
    )  # fmt: skip
    g = p.add_argument_group("producers (for paths that read from producers)")
    g.add_argument("--producers", type=positive_int, default=2, help="how many producer processes the run starts")
    g.add_argument(
        "--producer-kind", choices=KINDS, default="synthetic",
        help="what the producers send: random images, JPEGs decoded in Python, or a DALI pipeline",
    )  # fmt: skip
    g.add_argument("--producer", dest="producer_kind", choices=KINDS, help=argparse.SUPPRESS)  # the old spelling
    g.add_argument("--data", metavar="DIR", help="ImageNet-layout JPEG folder for --producer-kind decode|dali and dali")
    g.add_argument("--producer-workers", type=positive_int, default=1, help="worker processes per producer")
    g.add_argument(
        "--dali-threads",
        type=positive_int,
        help="threads of each DALI pipeline (dali producers, dali path); default: the cores per device, "
        "at most 4 when DALI decodes on the GPU",
    )
    g.add_argument(
        "--dali-device", choices=("cpu", "gpu"),
        help="where DALI decodes, in the dali path and the dali producers alike (default: gpu when there is one)",
    )  # fmt: skip
    g.add_argument("--wire-format", choices=("native", "zmq_ops"), default="native", help="wire format (docs/wire.md)")
    g.add_argument(
        "--transport", choices=("ipc", "shm"), default="ipc",
        help="how the run's own producers reach it: ipc sockets, or shared-memory slots with slot messages over ipc "
        "(one copy from producer to tensor; docs/wire.md)",
    )  # fmt: skip
    g.add_argument("--endpoint", help="use an external producer: bind this endpoint and wait for it")
    g.add_argument("--hwm", type=positive_int, default=4, help="ZMQ high-water mark, in batches")
    g.add_argument(
        "--recv-timeout", type=positive_float, default=60.0, help="seconds without a batch before the run fails"
    )
    g.add_argument(
        "--on-producer-exit", choices=("stop", "continue"), default="stop",
        help="when one of the run's producers dies: stop the run, or train on with the others",
    )  # fmt: skip
    g.add_argument(
        "--max-msg-size", type=positive_int, help="largest message accepted, bytes (default: from batch and image size)"
    )
    g.add_argument(
        "--allow-remote", action="store_true",
        help="allow --endpoint, or this cluster task's --*-hosts entry, on a non-loopback address (unauthenticated)",
    )  # fmt: skip
    g.add_argument("--curve-keys", metavar="DIR", help="encrypt and authenticate the producers' streams (CURVE)")
    _add_loader_flags(p)
    p.add_argument("--json", dest="json_path", metavar="FILE", help="write the results to this JSON file")
    g = p.add_argument_group("several machines (--framework torch, on torchrun)")
    g.add_argument("--nnodes", type=positive_int, default=1, help="machines in the run, each running --num-gpus ranks")
    g.add_argument("--node-rank", type=non_negative_int, default=0, help="this machine's index, 0 to --nnodes - 1")
    g.add_argument("--master-addr", default="127.0.0.1", help="node 0's address, for the rendezvous")
    g.add_argument(
        "--master-port",
        type=positive_int,
        help="node 0's rendezvous port (default: a free port; 29500 across machines)",
    )
    g = p.add_argument_group("profiling and sweeps (docs/profiling.md)")
    g.add_argument(
        "--no-telemetry", dest="telemetry", action="store_false",
        help="no per-stage telemetry or verdict (to see its cost)",
    )  # fmt: skip
    g.add_argument(
        "--producer-rate",
        type=positive_float,
        metavar="IMAGES_PER_SEC",
        help="cap each producer worker (a slow loader)",
    )
    g.add_argument(
        "--producer-busy-wait",
        action="store_true",
        help="producers spin while the consumer has no room (a polling loader)",
    )
    g.add_argument(
        "--producer-cpu-ms", type=positive_float, metavar="MS",
        help="synthetic producers spend this much CPU per batch, as decoding would (a CPU-hungry loader)",
    )  # fmt: skip
    g.add_argument(
        "--profile", dest="profile_dir", metavar="DIR", help="write a TensorFlow trace of a few measured steps"
    )
    g.add_argument(
        "--sweep", action="store_true",
        help="--fake-location, --num-gpus, --batch, --use-fp16 and --use-xla-compile take comma lists; run the grid",
    )  # fmt: skip
    g.add_argument("--out", metavar="DIR", help="write results.{json,csv,md,png} here (default for --sweep: results/)")
    cluster_spec.add_flags(p)
    return p.parse_args(argv)


def _add_loader_flags(p: argparse.ArgumentParser) -> None:
    """Your own loader as the run's producers (--loader), or measured alone (--loader-only)."""
    from core.cli_types import positive_float, positive_int
    from producers.loader import add_loader_args

    g = p.add_argument_group("your own loader (--loader MODULE:CALLABLE; docs/loader.md)")
    add_loader_args(g, required=False)
    g.add_argument(
        "--loader-only", action="store_true",
        help="no trainer: the loader's images/s at 1, 2, ... workers up to the machine's cores, scaling, "
        "the cores --emulate/--num-devices would need, and where a sample's time goes",
    )  # fmt: skip
    g.add_argument("--num-devices", type=positive_int, help="--loader-only: devices to feed (with --emulate)")
    g.add_argument(
        "--loader-workers", type=positive_int, metavar="N", help="--loader-only: most workers tried (default: cores)"
    )
    g.add_argument(
        "--loader-seconds", type=positive_float, default=5.0, metavar="S",
        help="--loader-only: measured seconds per worker count (default 5)",
    )  # fmt: skip
    g.add_argument("--no-stages", action="store_true", help="--loader-only: skip the per-stage timing")


def _variable_update(text: str) -> str:
    if text == "horovod":
        raise argparse.ArgumentTypeError(
            "horovod: Horovod is not offered (it does not build against TensorFlow 2.21); "
            "use replicated or parameter_server"
        )
    return text


def config_from(args, paths: dict):
    """The run's BenchConfig: the chosen path after the baseline, or the registry's default run."""
    from core.config import BenchConfig
    from core.registry import BASELINE

    if args.fake_location:
        chosen = [BASELINE] + ([args.fake_location] if args.fake_location != BASELINE else [])
    else:
        chosen = [n for n, c in paths.items() if c.in_default_run]
    fields = {k: v for k, v in vars(args).items() if k in BenchConfig.__dataclass_fields__}
    if args.loader:
        fields["producer_kind"] = "loader"  # --loader: the run's producers are the user's loader
    if (args.emulate or args.emulate_rate is not None or args.find_capacity) and not args.bench:
        fields["model"] = "emulated"  # --emulate, --emulate-rate and --find-capacity imply --model emulated
    return BenchConfig(paths=chosen, **fields)


def validate(cfg, paths: dict) -> None:
    """Every check that needs no device: producer flags, each chosen path's own, the endpoint (ConfigError)."""
    from core.errors import ConfigError
    from runner.producer_group import check_producer_flags
    from wire.endpoints import EndpointError, check, check_reachable

    check_producer_flags(cfg)
    if cfg.model == "emulated":
        from core.config import emulated_batch
        from core.emulate import EmulateError, Emulation, check_step

        try:
            emu = Emulation.of(cfg.emulate, cfg.emulate_rate)
            check_step(emu.images_per_sec, cfg.batch or emulated_batch(emu.images_per_sec), cfg.recv_timeout)
        except EmulateError as e:
            raise ConfigError(str(e)) from None
        if cfg.input_only:
            raise ConfigError("--input-only and --model emulated: choose one (input-only has no device step)")
    for name in cfg.paths:
        paths[name].validate(cfg)
    if cfg.endpoint:
        try:
            check(cfg.endpoint, bind=True, allow_remote=cfg.allow_remote, secured=bool(cfg.curve_keys))
            check_reachable(cfg.endpoint)  # the external producer is another process
        except EndpointError as e:
            raise ConfigError(str(e)) from None


def check_machine(cfg, gpus: int) -> None:
    """Towers the machine has, and a batch it can hold (ConfigError)."""
    import os

    import psutil

    from core.errors import ConfigError

    if gpus and cfg.num_gpus > gpus:
        raise ConfigError(f"--num-gpus {cfg.num_gpus}: only {gpus} GPU(s) on this machine")
    if not gpus and cfg.dali_device == "gpu":
        raise ConfigError("--dali-device gpu: no GPU here; DALI decodes on the CPU (--dali-device cpu)")
    if not gpus and cfg.num_gpus > (os.cpu_count() or 1):
        raise ConfigError(
            f"--num-gpus {cfg.num_gpus}: no GPU here, and towers on CPU are limited to the {os.cpu_count()} CPU cores"
        )
    batch_bytes = cfg.batch * cfg.image_size * cfg.image_size * 3
    available = psutil.virtual_memory().available
    if batch_bytes * MEMORY_SHARE > available:
        raise ConfigError(
            f"--image-size {cfg.image_size}: one batch of {cfg.batch} is {batch_bytes / 1e9:.1f} GB, and a run keeps "
            f"about {MEMORY_SHARE} batches in memory; this machine has {available / 1e9:.1f} GB available"
        )


def _main(argv: list[str]) -> int:
    import os
    from dataclasses import replace

    from core import registry
    from core.errors import ConfigError
    from profiler.report import check_output_places
    from profiler.sweep import SweepError, split_args
    from runner import cluster_spec

    framework = _framework(argv)
    # --loader-only runs no trainer: no framework's paths to load (and no TensorFlow to import).
    paths = {} if "--loader-only" in argv else registry.load(framework)
    try:
        grid, argv = split_args(argv, list(paths))
    except SweepError as e:
        raise ConfigError(str(e)) from None
    args = parse_args(argv, paths)
    check_output_places(args.json_path, args.out or ("results" if grid is not None else None))
    if args.loader_only:
        if not args.loader:
            raise ConfigError("--loader-only needs --loader MODULE:CALLABLE")
        from runner.loader_only import main as loader_only

        return loader_only(args)
    if args.num_devices:
        raise ConfigError("--num-devices is for --loader-only; a run's devices are --num-gpus")
    cfg = config_from(args, paths)
    base = replace(cfg, shrunk={})  # a sweep applies the defaults per grid point
    if grid is not None:
        cfg.paths = grid.get("paths", cfg.paths)
        cfg.num_gpus = max(grid.get("num_gpus", [cfg.num_gpus or 1]))  # check the largest against the machine
    task = None  # this process's place in a TensorFlow cluster (docs/cluster.md)
    if framework == "torch" and (args.local_cluster or cfg.variable_update in cluster_spec.MODES):
        raise ConfigError(
            "--local-cluster and distributed_* updates are TensorFlow's; PyTorch uses --nnodes (torchrun)"
        )
    if args.local_cluster or cfg.variable_update in cluster_spec.MODES:
        task = cluster_spec.from_args(args, cfg, sweep=grid is not None)
        if task is None:
            from runner.local_cluster import run_local_cluster

            validate(replace(cfg, endpoint=cfg.endpoint and cfg.endpoint.replace("{task}", "0")), paths)
            return run_local_cluster(argv, args.local_cluster, cfg.variable_update)
        from runner import bind_host

        bind_host.ensure(task.host_port, task.address, task.allow_remote)  # listen on the task's own address only
    validate(cfg, paths)
    if grid is not None and grid.get("emulate_rate"):  # every swept rate, with the largest batch swept
        from core.config import emulated_batch
        from core.emulate import EmulateError, check_step

        for rate in grid["emulate_rate"]:
            try:
                check_step(rate, max(grid.get("batch") or [cfg.batch or emulated_batch(rate)]), cfg.recv_timeout)
            except EmulateError as e:
                raise ConfigError(str(e)) from None
    if framework == "torch":
        from torch_trainer.run import main as torch_main

        return torch_main(cfg, args, check_machine, sweep=(base, grid) if grid is not None else None)
    if args.nnodes > 1:
        raise ConfigError("--nnodes: several machines need --framework torch (torchrun)")
    if task is not None and task.job_name == "ps":  # serves variables: no towers, no device checks
        from tf_trainer.cluster_worker import run_task

        return run_task(cfg, task, False)

    from core.config import apply_defaults
    from tf_trainer import devices

    gpus = devices.gpu_count()
    for note in apply_defaults(cfg, gpus):
        print(f"note: {note}")
    check_machine(cfg, gpus)
    if task is not None:
        from tf_trainer.cluster_worker import run_task

        return run_task(cfg, task, gpus > 0)
    if grid is not None:
        return _sweep(base, grid, gpus, args.out or "results")
    started, results = _run(cfg, gpus > 0, batch_given=args.batch is not None)
    _report(cfg, results, args.out, started)
    if args.bench and not gpus:
        # Without a GPU every path keeps up with a CPU ResNet-50: ask instead how many emulated
        # H100s each path would keep fed (docs/emulated.md).
        cap = replace(base, model="emulated", emulate=base.emulate or "H100", find_capacity=True, shrunk={})
        cap.batch = cap.image_size = cap.warmup_steps = cap.steps = cap.repeats = None
        if cap.json_path:
            cap.json_path = cap.json_path.removesuffix(".json") + "-capacity.json"
        validate(cap, paths)
        for note in apply_defaults(cap, gpus):
            print(f"note: {note}")
        print()
        started, results = _run(cap, False, batch_given=False)
        _report(cap, results, os.path.join(args.out, "capacity") if args.out else None, started)
    return 0


def _framework(argv: list[str]) -> str:
    """--framework, read first: the input paths (and so the flags' choices) depend on it."""
    pre = _Parser(add_help=False)
    pre.add_argument("--framework", choices=("tf", "torch"), default="tf")
    return pre.parse_known_args(argv)[0].framework


def _sweep(base, grid: dict, gpus: int, out: str) -> int:
    import os

    from profiler.sweep import run_sweep
    from tf_trainer import devices

    doc = run_sweep(base, grid, gpus, out, devices.describe())
    print()
    print(open(os.path.join(out, "results.md")).read())
    print("\n".join(f"wrote {f}" for f in doc["files"]))
    return 0


def _model_words(cfg) -> str:
    """What the run trains: ResNet-50, or an emulated device with its rate and source."""
    if cfg.model == "emulated":
        e = cfg.emulation
        from core.emulate import rate_text

        return f"emulated {e['device']} ({rate_text(e['images_per_sec'])} img/s per device) [source: {e['source']}]"
    return f"ResNet-50 v{cfg.resnet_version}{' (input only)' if cfg.input_only else ''}"


def _run(cfg, has_gpu: bool, batch_given: bool = True) -> tuple[float, dict[str, dict]]:
    """Every chosen path in turn, one line each as it finishes (or, with --find-capacity, each path's capacity)."""
    import time

    from tf_trainer.run import run_path

    if cfg.find_capacity:
        from runner.capacity import find_capacities

        print(f"capacity: each path against {_model_words(cfg)}; probes of a few seconds", flush=True)
        _feeder_line(cfg)
        started = time.time()
        results, _ = find_capacities(cfg, lambda c, path: run_path(c, path, has_gpu), batch_given)
        return started, results
    print(
        f"feedbench: {_model_words(cfg)}, "
        f"{cfg.num_gpus} {'GPU' if has_gpu else 'CPU'} tower(s) x batch {cfg.batch}, {cfg.image_size}x{cfg.image_size}, "
        f"{cfg.variable_update}, {cfg.warmup_steps} warm-up + {cfg.repeats} x {cfg.steps} steps",
        flush=True,
    )
    _feeder_line(cfg)
    if "dali" in cfg.paths or cfg.producer_kind == "dali":
        print(f"DALI decodes on the {cfg.dali_device.upper()} (--dali-device)", flush=True)
    results: dict[str, dict] = {}
    started = time.time()
    for path in cfg.paths:
        t0 = time.perf_counter()
        print(f"- {path} ...", flush=True)
        r = results[path] = run_path(cfg, path, has_gpu)
        print(f"  {r['images_per_sec']['median']:.1f} images/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    return started, results


def _feeder_line(cfg) -> None:
    from core.registry import feeder_line

    if cfg.loader and (words := feeder_line(cfg, "tf")):
        print(words, flush=True)


def _report(cfg, results: dict[str, dict], out: str | None, started: float) -> None:
    """The tables, the verdicts, and the files asked for."""
    from core import registry
    from profiler import report
    from profiler.verdict import verdicts_text
    from tf_trainer import devices

    report.add_ratios(results)
    print()
    if cfg.model == "emulated":
        print(_model_words(cfg))
    print(report.table(results, cfg.num_gpus, cfg.input_only))
    if cfg.find_capacity:
        from runner.capacity import table as capacity_table

        print()
        print(capacity_table(results))
    if cfg.telemetry:
        print()
        print(verdicts_text(results))
    if cfg.profile_dir:
        from tf_trainer.tracing import how_to_open

        print()
        print(how_to_open(cfg.profile_dir))
    if out:
        from profiler.sweep import rows_of, write_results

        doc = {"device": devices.describe(), "rows": rows_of([{"config": cfg.to_dict(), "paths": results}])}
        extra = {}
        if cfg.find_capacity:
            from profiler.plot import capacity_png

            extra["capacity.png"] = capacity_png(results)
        files = write_results(out, doc, registry.names("tf"), extra)  # all of them, or none (a full disk)
        print("\n" + "\n".join(f"wrote {f}" for f in files))
    if cfg.json_path:
        base = results.get(registry.BASELINE, {})
        report.write_json(
            cfg.json_path,
            {
                "config": cfg.to_dict(),
                "device": devices.describe(),
                # Emulated runs say so, with the rate and its source (docs/emulated.md).
                "model": cfg.emulation if cfg.model == "emulated" else {"emulated": False, "name": "ResNet-50"},
                "reference": {"baseline": registry.BASELINE, "baseline_images_per_sec": base.get("images_per_sec")},
                "started": started,
                "paths": results,
                # Per path: the highest demand sustained at >= 97% of the baseline, with every probe tried.
                "capacity": {p: r["capacity"] for p, r in results.items() if r.get("capacity")} or None,
            },
        )
        print(f"\nwrote {cfg.json_path}")


if __name__ == "__main__":
    sys.exit(main())
