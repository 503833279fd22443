"""`python -m producers COMMAND`: one subcommand per kind of producer, plus benchmarks."""

from __future__ import annotations

import argparse
import importlib
import sys

from core.cli_types import positive_int
from producers.options import add_send_args, run_producer
from producers.synthetic import SyntheticSource
from wire import curve


def _synthetic(args: argparse.Namespace) -> int:
    if args.cpu_ms_per_batch < 0:
        print(f"error: --cpu-ms-per-batch {args.cpu_ms_per_batch:g} must be 0 or more", file=sys.stderr)
        return 2
    source = SyntheticSource(args.batch, args.image_size, args.classes, args.pool, args.seed, args.cpu_ms_per_batch)
    return run_producer(source, args, source.describe())


# The subcommands whose modules pull in heavy libraries (OpenCV, Pillow, simplejpeg; a loader's framework):
# imported only when asked for, so a synthetic producer and each of its workers start about 0.2 s sooner.
KINDS = {
    "make-dataset": "producers.dataset",
    "decode": "producers.decode",
    "read": "producers.read",
    "dali": "producers.dali_source",
    "loader": "producers.loader",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; `command` known: only that subcommand's module is imported (else all, for --help)."""
    parser = argparse.ArgumentParser(prog="python -m producers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("synthetic", help="push random uint8 images and int32 labels")
    add_send_args(p)
    p.add_argument("--batch", type=positive_int, default=64, help="images per batch")
    p.add_argument("--image-size", type=positive_int, default=224, help="image height and width")
    p.add_argument("--classes", type=positive_int, default=1000, help="labels are drawn from 0..classes-1")
    p.add_argument("--pool", type=positive_int, default=4, help="distinct pre-generated batches to cycle")
    p.add_argument("--seed", type=int, default=0, help="random seed of the pool")
    p.add_argument(
        "--cpu-ms-per-batch", type=float, default=0.0, metavar="MS",
        help="spend this much CPU time on each batch, as decoding and augmenting would (a CPU-hungry loader)",
    )  # fmt: skip
    p.set_defaults(func=_synthetic)

    p = sub.add_parser("make-keys", help="create CURVE key pairs for encrypted, authenticated streams")
    p.add_argument("folder", help="where to write server.key(_secret) and client.key(_secret)")
    p.set_defaults(func=lambda a: print(f"keys in {curve.make_keys(a.folder)}; copy the folder to every host") or 0)

    if command in ("synthetic", "make-keys"):
        return parser  # defined above: no other kind's module is needed
    for kind in [command] if command in KINDS else KINDS:
        importlib.import_module(KINDS[kind]).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    return args.func(args)
