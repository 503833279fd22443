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
    """The flags, one group per concern; input path names and their help come from the paths' declarations."""
    from runner import cluster_spec

    p = _Parser(prog="bench_input.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_path_flags(p, paths, _framework(argv))
    _add_model_flags(p)
    _add_emulation_flags(p)
    _add_producer_flags(p)
    _add_loader_flags(p)
    _add_engine_flags(p)
    p.add_argument("--json", dest="json_path", metavar="FILE", help="write the results to this JSON file")
    p.add_argument(
        "--compare", metavar="OLD.json",
        help="then compare the run's results (--json FILE, or --out DIR) with an earlier run's, path by path: "
        "exit 1 when a path is slower beyond noise (python -m profiler.compare; docs/results.md)",
    )  # fmt: skip
    _add_machine_flags(p)
    _add_profiling_flags(p)
    cluster_spec.add_flags(p)
    return p.parse_args(argv)


def _add_path_flags(p: argparse.ArgumentParser, paths: dict, framework: str) -> None:
    """Which trainer, and which input paths it runs: the choices are the declared paths ({name: Declaration})."""
    from core.registry import BASELINE

    p.add_argument(
        "--framework", choices=("tf", "torch"), default="tf", help="the trainer: TensorFlow (default) or PyTorch"
    )
    listing = "; ".join(f"{n}: {c.words('summary', framework)}" for n, c in paths.items())
    default_run = ", ".join(n for n, c in paths.items() if c.in_default_run)
    p.add_argument(
        "--fake-location", type=_path_list(list(paths)), metavar="PATH[,PATH...]",
        help=f"run these input paths and the {BASELINE} baseline (default: {default_run}). Paths: {listing}",
    )  # fmt: skip
    p.add_argument(
        "--real-data", action="store_true",
        help="--framework torch with --data DIR: every way to feed the model from the folder's JPEGs, on the "
        "same files at the same crop (ROI decode producers over shm://, torchvision's ImageFolder DataLoader, "
        "gpu-decode, and dali/spdl where installed), with each one's input cores and the cores it would need",
    )  # fmt: skip


def _path_list(known: list[str]):
    """--fake-location's type: one path name or a comma list of them, each a known path (kept as given)."""

    def checked(value: str) -> str:
        for name in value.split(","):
            if name.strip() not in known:
                raise argparse.ArgumentTypeError(f"invalid choice: {name.strip()!r} (choose from {', '.join(known)})")
        return value

    return checked


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """The trained model and its schedule: devices, batch, steps, variables, precision."""
    from core.cli_types import non_negative_int, positive_float, positive_int
    from runner import cluster_spec

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
    p.add_argument(
        "--learning-rate", type=positive_float, metavar="LR",
        help="the rate after the warm-up steps' linear warm-up (default 0.1 x total batch / 256); a result whose "
        "timed steps hold a non-finite loss or a skipped update is marked invalid",
    )  # fmt: skip
    p.add_argument("--input-only", action="store_true", help="no model: each path's input ceiling")


def _add_emulation_flags(p: argparse.ArgumentParser) -> None:
    """Emulated devices and the capacity search, which measure a path against a published rate."""
    from core.cli_types import non_negative_int, positive_float, positive_int
    from core.config import BenchConfig

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
        "--capacity-tries", type=non_negative_int, default=BenchConfig.capacity_tries, metavar="N",
        help="with --find-capacity: try each path's two decisive probes N more times; their spread is the "
        "capacity's interval, which tells paths apart (0: a quick search, one probe each, no interval to speak of)",
    )  # fmt: skip
    g.add_argument(
        "--capacity-probes", type=positive_int, default=BenchConfig.capacity_probes, metavar="N",
        help="with --find-capacity: at most N probes per path before its tries (fewer: a quicker, coarser bracket)",
    )  # fmt: skip
    g.add_argument(
        "--probe-warmup", dest="probe_warmup_s", type=positive_float, default=BenchConfig.probe_warmup_s,
        metavar="SECONDS", help="with --find-capacity: each probe warms up at least this long at its demand, so "
        "a loader's slow start (workers starting, caches filling) is not what is measured (default %(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--probe-window", dest="probe_window_s", type=positive_float, default=BenchConfig.probe_window_s,
        metavar="SECONDS", help="with --find-capacity: each probe's timed window lasts at least this long "
        "(default %(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--bench", action="store_true",
        help="what `make bench` runs: every path on the real model; without a GPU, then every path's capacity "
        "against emulated H100s (or --emulate NAME)",
    )  # fmt: skip


def _add_producer_flags(p: argparse.ArgumentParser) -> None:
    """The run's producer processes and the wire they send on."""
    from core.cli_types import positive_float, positive_int
    from producers.commands import KINDS

    g = p.add_argument_group("producers (for paths that read from producers)")
    g.add_argument("--producers", type=positive_int, default=2, help="how many producer processes the run starts")
    g.add_argument(
        "--dataset-workers", type=positive_int, metavar="N",
        help="PyTorch's python-dataset: DataLoader workers per rank, each fed by its share of the rank's producers "
        "(default: one per producer of the rank; at most that many)",
    )  # fmt: skip
    g.add_argument(
        "--producer-kind", choices=[k for k in KINDS if k != "read"], default="synthetic",
        help="what the producers send: random images, JPEGs decoded in Python, or a DALI pipeline",
    )  # fmt: skip
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
        "(zmq-consume's tensors are the slots themselves, the Python paths copy once; docs/wire.md)",
    )  # fmt: skip
    g.add_argument("--endpoint", help="use an external producer: bind this endpoint and wait for it")
    g.add_argument("--hwm", type=positive_int, default=4, help="ZMQ high-water mark, in batches")
    g.add_argument(
        "--recv-timeout", type=positive_float, default=60.0, help="seconds without a batch before the run fails"
    )
    g.add_argument(
        "--on-producer-exit", choices=("stop", "continue"), default="stop",
        help="when one of the run's producers (tf-data-service: its service workers) dies: stop the run, or train "
        "on with the others",
    )  # fmt: skip
    g.add_argument(
        "--max-msg-size", type=positive_int, help="largest message accepted, bytes (default: from batch and image size)"
    )
    g.add_argument(
        "--allow-remote", action="store_true",
        help="allow --endpoint, or this cluster task's --*-hosts entry, on a non-loopback address (unauthenticated)",
    )  # fmt: skip
    g.add_argument("--curve-keys", metavar="DIR", help="encrypt and authenticate the producers' streams (CURVE)")


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    """The data engines that make batches in processes of their own, here or on other hosts (docs/engines.md)."""
    from consumers.tf_data_service.path import MODES
    from core.cli_types import positive_int
    from core.config import BenchConfig

    g = p.add_argument_group("engines (--fake-location tf-data-service, ray-data)")
    g.add_argument(
        "--service-workers", type=positive_int, default=BenchConfig.service_workers,
        help="tf-data-service: worker processes the run starts, with a dispatcher, on 127.0.0.1; they run the "
        "synthetic or decode work, or --loader's tf.data pipeline (TensorFlow ops only)",
    )  # fmt: skip
    g.add_argument(
        "--dispatcher", metavar="grpc://HOST:PORT",
        help="tf-data-service: an existing tf.data service's dispatcher (the run starts none)",
    )  # fmt: skip
    g.add_argument(
        "--service-mode", choices=MODES, default="off",
        help="tf-data-service: each worker runs the whole source (off), or the dispatcher splits it (dynamic)",
    )  # fmt: skip
    g.add_argument(
        "--ray-cpus", type=positive_int, default=BenchConfig.ray_cpus,
        help="ray-data: CPUs of the Ray cluster the run starts on 127.0.0.1 (its workers run the pipeline)",
    )  # fmt: skip
    g.add_argument(
        "--ray-address", metavar="HOST:PORT",
        help="ray-data: an existing Ray cluster's head (GCS address; the run starts none)",
    )  # fmt: skip
    g.add_argument(
        "--ray-prefetch", type=positive_int, default=BenchConfig.ray_prefetch,
        help="ray-data: batches each rank's iterator fetches ahead (iter_batches' prefetch_batches)",
    )  # fmt: skip
    g.add_argument(
        "--ray-block-batches", type=positive_int, default=BenchConfig.ray_block_batches, metavar="N",
        help="ray-data: batches per block of the pipeline; each block is one Ray task, whose overhead (tens of ms "
        "on a small host) it shares (default %(default)s)",
    )  # fmt: skip


def _add_machine_flags(p: argparse.ArgumentParser) -> None:
    """Several machines in one PyTorch run, joined by torchrun's rendezvous."""
    from core.cli_types import non_negative_int, positive_int

    g = p.add_argument_group("several machines (--framework torch, on torchrun)")
    g.add_argument("--nnodes", type=positive_int, default=1, help="machines in the run, each running --num-gpus ranks")
    g.add_argument("--node-rank", type=non_negative_int, default=0, help="this machine's index, 0 to --nnodes - 1")
    g.add_argument("--master-addr", default="127.0.0.1", help="node 0's address, for the rendezvous")
    g.add_argument(
        "--master-port",
        type=positive_int,
        help="node 0's rendezvous port (default: a free port; 29500 across machines)",
    )


def _add_profiling_flags(p: argparse.ArgumentParser) -> None:
    """Telemetry, slow-loader knobs, traces and sweeps: what explains a path's figure."""
    from core.cli_types import non_negative_int, positive_float

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
        "--profile",
        dest="profile_dir",
        metavar="DIR",
        help="write a trace of a few steps after the timed ones (TensorFlow profiler, or torch.profiler)",
    )
    g.add_argument(
        "--interleave", type=non_negative_int, metavar="N",
        help="measure each path again in N short runs alternating with the baseline, for a ratio that a noisy "
        "machine disturbs less (the median of the paired ratios); default 3 where a GPU is used (a GPU that "
        "warms up or slows down moves both sides), else 0; 0 turns it off",
    )  # fmt: skip
    g.add_argument(
        "--sweep", action="store_true",
        help="--fake-location, --num-gpus, --batch, --use-fp16 and --use-xla-compile take comma lists; run the grid",
    )  # fmt: skip
    g.add_argument("--out", metavar="DIR", help="write results.{json,csv,md,png} here (default for --sweep: results/)")


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
    g.add_argument(
        "--tune", action="store_true",
        help="--loader-only: the smallest setting of the loader (a DataLoader's num_workers, prefetch_factor, "
        "persistent_workers, pin_memory; tf.data's num_parallel_calls, prefetch, private_threadpool_size; a "
        "DataFlow's num_proc) that meets --emulate/--num-devices or --target-rate, as the line to paste",
    )  # fmt: skip
    g.add_argument(
        "--target-rate", type=positive_float, metavar="IMAGES_PER_SEC",
        help="--loader-only: the rate the loader should give (instead of --emulate/--num-devices)",
    )  # fmt: skip
    g.add_argument(
        "--epochs", type=positive_int, metavar="N",
        help="--loader-only: instead of the sweep, one copy of the loader through N whole epochs: each epoch's "
        "first batch, worker start-up and rate, and the rate per second across each epoch's end (a DataLoader "
        "with workers: with and without persistent_workers)",
    )  # fmt: skip


def _variable_update(text: str) -> str:
    if text == "horovod":
        raise argparse.ArgumentTypeError(
            "horovod: Horovod is not offered (it does not build against TensorFlow 2.21); "
            "use replicated or parameter_server"
        )
    return text


def check_environment() -> None:
    """The environment variables a run reads later, checked before anything starts (one line each)."""
    from consumers.zmq_pull import io_threads

    io_threads()  # FEEDBENCH_ZMQ_IO_THREADS, parsed by the native receiver's rule too


def check_places(args) -> None:
    """Refuse, before anything runs, an empty or '-' output name, a --profile place that is no folder, and
    --compare where no trainer run's results are made to compare."""
    import os

    from core.errors import ConfigError
    from profiler.report import writable_folder

    if args.compare and args.loader_only:
        raise ConfigError("--compare and --loader-only: a comparison is of a trainer run's paths; drop one")
    for flag, value in (("--json", args.json_path), ("--out", args.out), ("--profile", args.profile_dir)):
        if value is not None and value.strip() in ("", "-"):
            raise ConfigError(f"{flag} {value!r}: give the name of a file or folder to write (not stdout)")
    place = args.profile_dir
    if place is None:
        return
    if os.path.exists(place) and not os.path.isdir(place):
        raise ConfigError(f"--profile {place}: exists and is not a folder; the trace needs a folder")
    writable_folder("--profile", place, place if os.path.isdir(place) else os.path.dirname(os.path.abspath(place)))


def check_epochs(args) -> None:
    """--epochs is --loader-only's epoch report: refuse it elsewhere, and the sweep's flags beside it."""
    from core.errors import ConfigError

    if not args.loader_only:
        raise ConfigError(
            f"--epochs {args.epochs}: only with --loader-only (the loader alone across its epochs); "
            "a trainer run reports each path's first batch by itself"
        )
    sweep = [f for f, v in (("--loader-workers", args.loader_workers), ("--emulate", args.emulate),
                            ("--emulate-rate", args.emulate_rate), ("--num-devices", args.num_devices),
                            ("--target-rate", args.target_rate)) if v]  # fmt: skip
    if sweep:
        raise ConfigError(f"--epochs runs one copy of the loader, not the worker sweep: drop {', '.join(sweep)}")


def check_loader_only_flags(args) -> None:
    """--tune and --target-rate, and --epochs: --loader-only's own flags, each refused where it does not belong."""
    if args.tune or args.target_rate is not None:
        check_tune(args)
    if args.epochs is not None:
        check_epochs(args)


def check_tune(args) -> None:
    """--tune and --target-rate belong to --loader-only; --tune needs one demand and is not the epoch report."""
    from core.errors import ConfigError

    flag = "--tune" if args.tune else f"--target-rate {args.target_rate:g}"
    if not args.loader_only:
        raise ConfigError(f"{flag}: only with --loader-only --loader MODULE:CALLABLE (the loader measured alone)")
    if args.tune and args.epochs is not None:
        raise ConfigError(f"--tune and --epochs {args.epochs}: the settings search or the epoch report; choose one")
    emulated = [f for f, v in (("--emulate", args.emulate), ("--emulate-rate", args.emulate_rate is not None),
                               ("--num-devices", args.num_devices)) if v]  # fmt: skip
    if args.target_rate is not None and emulated:
        raise ConfigError(f"--target-rate and {', '.join(emulated)}: one demand; choose one")
    if args.tune and args.target_rate is None and not emulated:
        raise ConfigError(
            "--tune needs a demand to meet: --emulate NAME --num-devices N, or --target-rate IMAGES_PER_SEC"
        )


def check_interleave(args, grid: dict | None) -> None:
    """--interleave N alternates one run's paths with its baseline: refused where no such run is made (a capacity
    search's probes, a sweep's grid points, the loader alone), rather than recorded and not done."""
    from core.errors import ConfigError

    if not args.interleave:
        return
    for flag, given in (("--find-capacity", args.find_capacity), ("--sweep", grid is not None),
                        ("--loader-only", args.loader_only)):  # fmt: skip
        if given:
            raise ConfigError(
                f"--interleave {args.interleave} and {flag}: only a run of paths against their baseline is "
                "interleaved; drop one (run the path of interest alone with --interleave)"
            )


def config_from(args, paths: dict):
    """The run's BenchConfig: the chosen path after the baseline, or the declared default run."""
    from core.config import BenchConfig
    from core.errors import ConfigError
    from core.registry import BASELINE

    if args.fake_location:
        given = [p.strip() for p in args.fake_location.split(",")]
        chosen = [BASELINE] + [p for p in dict.fromkeys(given) if p != BASELINE]
    else:
        chosen = [n for n, c in paths.items() if c.in_default_run]
    fields = {k: v for k, v in vars(args).items() if k in BenchConfig.__dataclass_fields__}
    if args.loader:
        if args.producer_kind not in ("synthetic", "loader"):
            raise ConfigError(
                f"--loader and --producer-kind {args.producer_kind}: the loader is the run's producers; drop one"
            )
        fields["producer_kind"] = "loader"  # --loader: the run's producers are the user's loader
    if (args.emulate or args.emulate_rate is not None or args.find_capacity) and not args.bench:
        fields["model"] = "emulated"  # --emulate, --emulate-rate and --find-capacity imply --model emulated
    if args.real_data:
        chosen, more = real_data(args, paths)
        fields.update(more)
    return BenchConfig(paths=chosen, **fields)


REAL_DATA_LOADER = "examples/torchvision_imagefolder.py:make_loader"


def real_data(args, paths: dict) -> tuple[list[str], dict]:
    """--real-data: the paths that decode --data's JPEGs (dali and spdl where installed) and the flags they share.

    The producers decode with the ROI decoder into shm:// slots; the loader path runs torchvision's
    ImageFolder with as many DataLoader workers as there are producers; every one takes an Inception-style
    random-resized crop (torchvision's RandomResizedCrop) and a random flip.
    """
    import importlib.util

    from core.errors import ConfigError
    from core.loader_spec import absolute_target
    from core.registry import BASELINE

    if args.framework != "torch" or not args.data:
        raise ConfigError("--real-data runs the PyTorch trainer on a JPEG folder: add --framework torch --data DIR")
    if args.fake_location or args.loader or args.endpoint or args.producer_kind != "synthetic":
        raise ConfigError("--real-data chooses the paths, producers and loader itself: drop --fake-location, "
                          "--loader, --endpoint and --producer-kind")  # fmt: skip
    chosen = [BASELINE, "zmq-consume", "loader", "gpu-decode"]
    installed = {"dali": "nvidia.dali", "spdl": "spdl"}
    chosen += [p for p, module in installed.items() if p in paths and importlib.util.find_spec(module) is not None]
    loader_args = [f"data={args.data}", f"num_workers={args.producers}"]
    fields = {"producer_kind": "decode", "transport": "shm", "real_data": True}
    return chosen, {**fields, "loader": absolute_target(REAL_DATA_LOADER), "loader_arg": loader_args}


def validate(cfg, framework: str) -> None:
    """Every check that needs no device (ConfigError): producer flags, each chosen path's declared checks (with
    what its half of `framework` needs, checked without importing the framework), the endpoint."""
    from consumers.declared import check_declared
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
    check_declared(cfg, framework)
    if cfg.endpoint:
        try:
            check(cfg.endpoint, bind=True, allow_remote=cfg.allow_remote, secured=bool(cfg.curve_keys))
            check_reachable(cfg.endpoint)  # the external producer is another process
        except EndpointError as e:
            raise ConfigError(str(e)) from None


def _main(argv: list[str]) -> int:
    """Parse, check what needs no device, pick the framework's plugin; the harness does the rest."""
    from dataclasses import replace

    from consumers import declared
    from core import registry
    from core.errors import ConfigError
    from profiler.report import check_output_places
    from profiler.sweep import SweepError, split_args
    from runner import cluster_spec

    framework = _framework(argv)
    # The flags are read and checked from the paths' declarations: the framework is imported only for a run
    # that passed every check (and --loader-only runs no trainer: no TensorFlow, no PyTorch).
    choices = declared.of(framework)
    try:
        grid, argv = split_args(argv, list(choices))
    except SweepError as e:
        raise ConfigError(str(e)) from None
    args = parse_args(argv, choices)
    if args.loader:
        from core.loader_spec import absolute_target

        args.loader = absolute_target(args.loader)  # producers and ranks run in the project's folder
    check_places(args)
    check_environment()
    check_output_places(args.json_path, args.out or ("results" if grid is not None else None))
    check_loader_only_flags(args)
    check_interleave(args, grid)
    if args.loader_only:
        return _loader_only(args)
    if args.num_devices:
        raise ConfigError("--num-devices is for --loader-only; a run's devices are --num-gpus")
    registry.refuse_limits(framework, args)  # flags this framework's trainer cannot honour
    cfg = config_from(args, choices)
    base = replace(cfg, shrunk={})  # a sweep applies the defaults per grid point
    comparison = check_compare(args, grid, cfg, framework)  # --compare: OLD read, before anything runs
    if grid is not None:
        cfg.paths = grid.get("paths", cfg.paths)
        cfg.num_gpus = max(grid.get("num_gpus", [cfg.num_gpus or 1]))  # check the largest against the machine
    task = None  # this process's place in a TensorFlow cluster (docs/cluster.md)
    if args.local_cluster or cfg.variable_update in cluster_spec.MODES:
        task = cluster_spec.from_args(args, cfg, sweep=grid is not None)
        if task is None:
            from runner.local_cluster import run_local_cluster

            validate(replace(cfg, endpoint=cfg.endpoint and cfg.endpoint.replace("{task}", "0")), framework)
            return run_local_cluster(argv, args.local_cluster, cfg.variable_update)
        from runner import bind_host

        bind_host.ensure(task.host_port, task.address, task.allow_remote)  # listen on the task's own address only
    validate(cfg, framework)
    if grid is not None and grid.get("emulate_rate"):
        _check_swept_rates(grid, cfg)
    from harness import run

    trainer = run.load(framework, args)
    if task is not None:  # a task of a TensorFlow cluster: the cluster's own run and report
        return trainer.run_task(cfg, task)
    return compared(comparison, run.main(trainer, cfg, base, grid, args.out, args.bench))


def check_compare(args, grid: dict | None, cfg, framework: str) -> tuple[str, str] | None:
    """--compare OLD.json: (OLD, the file the run's results go to), once OLD reads as a result that the run's
    given flags do not already differ from (ConfigError, CompareError: one line); None without --compare."""
    if not args.compare:
        return None
    import os

    from core.errors import ConfigError
    from profiler.compare import CompareError, difference, load, refusal
    from runner import cluster_spec

    for flag, given in (("--sweep", grid is not None), ("--find-capacity", args.find_capacity),
                        ("--bench", args.bench), ("--local-cluster", args.local_cluster),
                        (f"--variable-update {cfg.variable_update}", cfg.variable_update in cluster_spec.MODES)):  # fmt: skip
        if given:
            raise ConfigError(f"--compare and {flag}: a comparison is of one run's paths on one machine; drop one")
    if not args.json_path and not args.out:
        raise ConfigError("--compare needs --json FILE or --out DIR: where the run's results go, to be compared")
    new = args.json_path or os.path.join(args.out, "results.json")
    refuse_overwritten(args.compare, args.json_path, args.out)
    if diff := difference(load(args.compare), {"framework": framework, "config": cfg.to_dict()}, given_only=True):
        raise CompareError(refusal(args.compare, "this run", diff))
    return args.compare, new


def refuse_overwritten(old: str, json_path: str | None, out: str | None) -> None:
    """ConfigError when --compare's OLD is (or resolves to) a file the run writes: the run would compare itself
    with itself and replace the earlier figures."""
    import os

    from core.errors import ConfigError
    from profiler.report import OUT_FILES

    written = [("--json", json_path)] if json_path else []
    written += [("--out", os.path.join(out, name)) for name in OUT_FILES] if out else []
    for flag, place in written:
        if os.path.realpath(old) == os.path.realpath(place):
            given = json_path if flag == "--json" else out
            raise ConfigError(
                f"--compare {old}: is {place}, which this run writes ({flag} {given}); the run would be compared "
                "with itself and the earlier results replaced: copy them elsewhere and compare with the copy"
            )


def compared(comparison: tuple[str, str] | None, code: int) -> int:
    """The run's exit code, or, after a run that succeeded, the comparison's (1: a path slower beyond noise)."""
    if comparison is None or code != 0:
        return code
    from profiler.compare import compare_files

    print()
    return compare_files(*comparison)


def _loader_only(args) -> int:
    """--loader-only: the worker sweep, or with --epochs the epoch report; no trainer."""
    from core.errors import ConfigError

    if not args.loader:
        raise ConfigError("--loader-only needs --loader MODULE:CALLABLE")
    if args.epochs is not None:
        from runner.loader_epochs import main as loader_epochs

        return loader_epochs(args)
    if args.tune:
        from runner.loader_tune import main as loader_tune

        return loader_tune(args)
    from runner.loader_only import main as loader_only

    return loader_only(args)


def _check_swept_rates(grid: dict, cfg) -> None:
    """Every swept emulated rate, with the largest batch swept, before the first grid point runs."""
    from core.config import emulated_batch
    from core.emulate import EmulateError, check_step
    from core.errors import ConfigError

    for rate in grid["emulate_rate"]:
        try:
            check_step(rate, max(grid.get("batch") or [cfg.batch or emulated_batch(rate)]), cfg.recv_timeout)
        except EmulateError as e:
            raise ConfigError(str(e)) from None


def _framework(argv: list[str]) -> str:
    """--framework, read first: the input paths (and so the flags' choices) depend on it."""
    pre = _Parser(add_help=False)
    pre.add_argument("--framework", choices=("tf", "torch"), default="tf")
    return pre.parse_known_args(argv)[0].framework


if __name__ == "__main__":
    sys.exit(main())
