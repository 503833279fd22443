#!/usr/bin/env python3
"""feedbench: how much training throughput does an input pipeline cost?

Trains ResNet-50 on several devices, fed by each input path in turn, and
reports images/s against the same model fed by data already on the device:

    python bench_input.py                              # all five paths
    python bench_input.py --fake-location zmq-consume  # one path and the gpu baseline
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

from trainer.config import ALL_PATHS, BASELINE, PATHS, BenchConfig, apply_defaults


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_input.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--framework", choices=("tf", "torch"), default="tf", help="the trainer: TensorFlow (default) or PyTorch"
    )
    p.add_argument(
        "--fake-location",
        choices=(*ALL_PATHS, "spdl"),
        help="run this input path and the gpu baseline (default: all paths)",
    )
    p.add_argument(
        "--num-gpus",
        type=positive_int,
        help="towers (devices); default: every GPU, or 2 CPU devices when there is no GPU",
    )
    p.add_argument("--batch", type=positive_int, help="batch size per device")
    p.add_argument("--image-size", type=positive_int)
    p.add_argument("--warmup-steps", type=int, help="steps run before timing (default 20; fewer on CPU)")
    p.add_argument("--steps", type=positive_int, help="timed steps per repeat (default 100; fewer on CPU)")
    p.add_argument("--repeats", type=positive_int, help="timed repeats; the median is reported (default 7)")
    p.add_argument("--variable-update", choices=("replicated", "parameter_server", "horovod"), default="replicated")
    p.add_argument("--ps-device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--resnet-version", choices=("1", "1.5"), default="1.5")
    p.add_argument("--data-format", choices=("NCHW", "NHWC"), help="default NCHW on GPU, NHWC on CPU")
    p.add_argument("--use-fp16", action="store_true", help="fp16 compute, fp32 master weights, loss scaling")
    p.add_argument("--use-xla-compile", action="store_true")
    p.add_argument("--input-only", action="store_true", help="no model: each path's input ceiling")
    g = p.add_argument_group("producers (python-queue, python-dataset, zmq-consume)")
    g.add_argument("--producers", type=positive_int, default=2, help="producer processes the run starts")
    g.add_argument(
        "--producer", choices=("synthetic", "decode", "dali"), default="synthetic",
        help="what the producers send: random images, JPEGs decoded in Python, or a DALI pipeline",
    )  # fmt: skip
    g.add_argument("--data", metavar="DIR", help="ImageNet-layout JPEG folder for --producer decode|dali")
    g.add_argument("--producer-workers", type=positive_int, default=1, help="worker processes per producer")
    g.add_argument("--wire-format", choices=("native", "zmq_ops"), default="native")
    g.add_argument("--endpoint", help="use an external producer: bind this endpoint and wait for it")
    g.add_argument("--hwm", type=positive_int, default=4, help="ZMQ high-water mark, in batches")
    g.add_argument("--recv-timeout", type=float, default=60.0, help="seconds without a batch before the run fails")
    g.add_argument(
        "--on-producer-exit", choices=("stop", "continue"), default="stop",
        help="when one of the run's producers dies: stop the run, or train on with the others",
    )  # fmt: skip
    g.add_argument(
        "--max-msg-size", type=positive_int, help="largest message accepted, bytes (default: from batch and image size)"
    )
    g.add_argument(
        "--allow-remote", action="store_true", help="allow --endpoint on a non-loopback address (unauthenticated)"
    )
    g.add_argument("--curve-keys", metavar="DIR", help="encrypt and authenticate the Python paths' streams (CURVE)")
    p.add_argument("--json", dest="json_path", help="write the results to this JSON file")
    g = p.add_argument_group("several machines (--framework torch, on torchrun)")
    g.add_argument("--nnodes", type=positive_int, default=1, help="machines in the run, each running --num-gpus ranks")
    g.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0 to --nnodes - 1")
    g.add_argument("--master-addr", default="127.0.0.1", help="node 0's address, for the rendezvous")
    g.add_argument(
        "--master-port", type=int, help="node 0's rendezvous port (default: free port; 29500 across machines)"
    )
    g = p.add_argument_group("profiling and sweeps (docs/profiling.md)")
    g.add_argument(
        "--no-telemetry",
        dest="telemetry",
        action="store_false",
        help="no per-stage telemetry or verdict (to see its cost)",
    )
    g.add_argument(
        "--producer-rate", type=float, metavar="IMAGES_PER_SEC", help="cap each producer worker (a slow loader)"
    )
    g.add_argument(
        "--profile", dest="profile_dir", metavar="DIR", help="write a TensorFlow trace of a few measured steps"
    )
    g.add_argument(
        "--sweep", action="store_true",
        help="--fake-location, --num-gpus, --batch, --use-fp16 and --use-xla-compile take comma lists; run the grid",
    )  # fmt: skip
    g.add_argument("--out", metavar="DIR", help="write results.{json,csv,md,png} here (default for --sweep: results/)")
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> BenchConfig:
    if args.framework == "tf" and args.fake_location and args.fake_location not in ALL_PATHS:
        raise SystemExit(fail(f"--fake-location {args.fake_location}: a PyTorch path; add --framework torch"))
    paths = (
        [BASELINE, args.fake_location]
        if args.fake_location and args.fake_location != BASELINE
        else ([BASELINE] if args.fake_location else list(PATHS))
    )
    fields = {k: v for k, v in vars(args).items() if k in BenchConfig.__dataclass_fields__}
    return BenchConfig(paths=paths, **fields)


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    from profiler.sweep import SweepError, split_args

    try:
        grid, argv = split_args(sys.argv[1:] if argv is None else list(argv))
    except SweepError as e:
        return fail(str(e))
    args = parse_args(argv)
    cfg = config_from(args)
    if args.producer_rate is not None and args.producer_rate <= 0:
        return fail(f"--producer-rate {args.producer_rate:g} must be more than 0")
    base = replace(cfg, shrunk={})  # a sweep applies the defaults per grid point
    if grid is not None:
        cfg.paths = grid.get("paths", cfg.paths)
        cfg.num_gpus = max(grid.get("num_gpus", [cfg.num_gpus or 1]))  # check the largest against the machine
    if cfg.warmup_steps is not None and cfg.warmup_steps < 0:
        return fail(f"--warmup-steps {cfg.warmup_steps} must be 0 or more")
    if args.framework == "torch":
        from torch_trainer.run import main as torch_main

        return torch_main(cfg, args, sweep=grid is not None)
    if args.nnodes > 1:
        return fail("--nnodes: several machines need --framework torch (torchrun)")
    if cfg.variable_update == "horovod":
        try:
            import horovod.tensorflow  # noqa: F401
        except ImportError:
            return fail(
                "--variable-update horovod: Horovod is not importable here (it does not build against TensorFlow 2.21); use replicated or parameter_server"
            )
    if cfg.producer != "synthetic":
        if not cfg.data:
            return fail(f"--producer {cfg.producer} needs --data DIR (make one: python -m producers make-dataset DIR)")
        if not os.path.isdir(cfg.data):
            return fail(f"--data {cfg.data}: no such folder")
        if cfg.producer == "dali":
            import importlib.util

            if importlib.util.find_spec("nvidia.dali") is None:
                return fail("--producer dali: NVIDIA DALI is not installed (pip install -e '.[dali]')")
    if "dali" in cfg.paths:
        from consumers.dali_tf import INSTALL_HINT, plugin_available

        if not cfg.data or not os.path.isdir(cfg.data):
            return fail(
                "--fake-location dali needs --data DIR, a JPEG folder (make one: python -m producers make-dataset DIR)"
            )
        if not plugin_available():
            return fail(f"--fake-location dali: DALI's TensorFlow plugin is not installed; {INSTALL_HINT}")
    if cfg.curve_keys and "zmq-consume" in cfg.paths:
        return fail("--curve-keys: the zmq_ops op does not speak CURVE; use it with python-queue or python-dataset")
    if cfg.endpoint:
        from wire.endpoints import EndpointError, check

        try:
            check(cfg.endpoint, bind=True, allow_remote=cfg.allow_remote)
        except EndpointError as e:
            return fail(str(e))

    # Ctrl-C and SIGTERM stop producers and exit at once, even mid-step (see trainer/shutdown.py).
    from trainer import shutdown

    shutdown.install()

    from trainer import devices, report
    from trainer.run import InputError, run_path

    gpus = devices.gpu_count()
    has_gpu = gpus > 0
    for note in apply_defaults(cfg, gpus):
        print(f"note: {note}")
    if has_gpu and cfg.num_gpus > gpus:
        return fail(f"--num-gpus {cfg.num_gpus}: only {gpus} GPU(s) on this machine")
    if not has_gpu and cfg.num_gpus > (os.cpu_count() or 1):
        return fail(
            f"--num-gpus {cfg.num_gpus}: no GPU here, and towers on CPU are limited to the {os.cpu_count()} CPU cores"
        )

    if grid is not None:
        from profiler.sweep import run_sweep

        out = args.out or "results"
        try:
            doc = run_sweep(base, grid, gpus, out, devices.describe())
        except InputError as e:
            return fail(str(e))
        print()
        print(open(os.path.join(out, "results.md")).read())
        print("\n".join(f"wrote {f}" for f in doc["files"]))
        return 0

    print(
        f"feedbench: ResNet-50 v{cfg.resnet_version}{' (input only)' if cfg.input_only else ''}, "
        f"{cfg.num_gpus} {'GPU' if has_gpu else 'CPU'} tower(s) x batch {cfg.batch}, {cfg.image_size}x{cfg.image_size}, "
        f"{cfg.variable_update}, {cfg.warmup_steps} warm-up + {cfg.repeats} x {cfg.steps} steps",
        flush=True,
    )
    results: dict[str, dict] = {}
    started = time.time()
    try:
        for path in cfg.paths:
            t0 = time.perf_counter()
            print(f"- {path} ...", flush=True)
            results[path] = run_path(cfg, path, has_gpu)
            r = results[path]
            print(f"  {r['images_per_sec']['median']:.1f} images/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    except InputError as e:
        return fail(str(e))
    report.add_ratios(results)
    print()
    print(report.table(results, cfg.num_gpus, cfg.input_only))
    if cfg.telemetry:
        from profiler.verdict import add_verdicts, line
        from profiler.verdict import table as verdict_table

        add_verdicts(results)
        print()
        print(verdict_table(results))
        print()
        for path, r in results.items():
            print(line(path, r["verdict"]))
    if cfg.profile_dir:
        from profiler.tracing import how_to_open

        print()
        print(how_to_open(cfg.profile_dir))
    if args.out:
        from profiler.sweep import rows_of, write_results

        files = write_results(
            args.out, {"device": devices.describe(), "rows": rows_of([{"config": cfg.to_dict(), "paths": results}])}
        )
        print("\n" + "\n".join(f"wrote {f}" for f in files))
    if cfg.json_path:
        report.write_json(
            cfg.json_path,
            {
                "config": cfg.to_dict(),
                "device": devices.describe(),
                "reference": {
                    "baseline": BASELINE,
                    "baseline_images_per_sec": results.get(BASELINE, {}).get("images_per_sec"),
                },
                "started": started,
                "paths": results,
            },
        )
        print(f"\nwrote {cfg.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
