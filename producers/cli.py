"""`python -m producers COMMAND`: one subcommand per kind of producer, plus benchmarks."""

from __future__ import annotations

import argparse

from core.cli_types import positive_int
from producers import dali_source, dataset, decode
from producers.options import add_send_args, run_producer
from producers.synthetic import SyntheticSource
from wire import curve


def _synthetic(args: argparse.Namespace) -> int:
    source = SyntheticSource(args.batch, args.image_size, args.classes, args.pool, args.seed)
    return run_producer(source, args, source.describe())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m producers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("synthetic", help="push random uint8 images and int32 labels")
    add_send_args(p)
    p.add_argument("--batch", type=positive_int, default=64, help="images per batch")
    p.add_argument("--image-size", type=positive_int, default=224, help="image height and width")
    p.add_argument("--classes", type=positive_int, default=1000, help="labels are drawn from 0..classes-1")
    p.add_argument("--pool", type=positive_int, default=4, help="distinct pre-generated batches to cycle")
    p.add_argument("--seed", type=int, default=0, help="random seed of the pool")
    p.set_defaults(func=_synthetic)

    p = sub.add_parser("make-keys", help="create CURVE key pairs for encrypted, authenticated streams")
    p.add_argument("folder", help="where to write server.key(_secret) and client.key(_secret)")
    p.set_defaults(func=lambda a: print(f"keys in {curve.make_keys(a.folder)}; copy the folder to every host") or 0)

    for module in (dataset, decode, dali_source):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
