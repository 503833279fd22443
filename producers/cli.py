"""`python -m producers COMMAND`: one subcommand per kind of producer, plus benchmarks."""

from __future__ import annotations

import argparse
import sys

from producers import launcher
from producers.sender import SendConfig
from producers.synthetic import SyntheticSource
from wire import curve
from wire.endpoints import EndpointError, check
from wire.message import FORMATS


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def add_send_args(p: argparse.ArgumentParser) -> None:
    """The flags every producer shares: where and how it sends, and how many workers."""
    g = p.add_argument_group("sending")
    g.add_argument("--endpoint", required=True, help="ZMQ endpoint, e.g. ipc:///tmp/feed or tcp://127.0.0.1:5555")
    g.add_argument("--bind", action="store_true", help="bind the endpoint (default: connect; the consumer binds)")
    g.add_argument("--format", choices=FORMATS, default="native", help="wire format (default: native)")
    g.add_argument("--hwm", type=positive_int, default=4, help="ZMQ send high-water mark, in batches")
    g.add_argument("--workers", type=positive_int, default=1, help="worker processes")
    g.add_argument("--count", type=positive_int, default=None, help="total batches to send (default: until stopped)")
    g.add_argument("--rate", type=float, default=None, help="cap each worker at this many images/s")
    g.add_argument("--producer-id", type=int, default=0, help="id of worker 0; worker i sends as id+i")
    g.add_argument(
        "--give-up-after", type=float, default=60.0, help="stop when no consumer takes a batch for this many seconds"
    )
    g.add_argument("--allow-remote", action="store_true", help="allow binding a non-loopback address (unauthenticated)")
    g.add_argument(
        "--curve-keys", metavar="DIR", help="encrypt and authenticate with the CURVE keys in DIR (see make-keys)"
    )
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument(
        "--busy-wait", action="store_true", help="spin while the consumer has no room (a polling loader: uses a core)"
    )


def send_config(args: argparse.Namespace) -> SendConfig:
    return SendConfig(
        endpoint=args.endpoint,
        fmt=args.format,
        hwm=args.hwm,
        bind=args.bind,
        count=args.count,
        rate=args.rate,
        producer_id=args.producer_id,
        give_up_after=args.give_up_after,
        allow_remote=args.allow_remote,
        curve_keys=args.curve_keys,
        busy_wait=args.busy_wait,
    )


def run_producer(source, args: argparse.Namespace, describe: str) -> int:
    """Check the endpoint up front, then run the workers; one line on any error."""
    try:
        check(args.endpoint, args.bind, args.allow_remote)
        if args.bind and args.workers > 1:
            raise EndpointError(
                f"endpoint {args.endpoint!r}: --bind takes one worker; with --workers {args.workers}, "
                "let the consumer bind and the producer connect"
            )
    except EndpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return launcher.launch(source, send_config(args), args.workers, progress=not args.quiet, describe=describe)


def _synthetic(args: argparse.Namespace) -> int:
    if args.cpu_ms_per_batch < 0:
        print(f"error: --cpu-ms-per-batch {args.cpu_ms_per_batch:g} must be 0 or more", file=sys.stderr)
        return 2
    source = SyntheticSource(args.batch, args.image_size, args.classes, args.pool, args.seed, args.cpu_ms_per_batch)
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cpu-ms-per-batch", type=float, default=0.0, metavar="MS",
        help="spend this much CPU time on each batch, as decoding and augmenting would (a CPU-hungry loader)",
    )  # fmt: skip
    p.set_defaults(func=_synthetic)

    p = sub.add_parser("make-keys", help="create CURVE key pairs for encrypted, authenticated streams")
    p.add_argument("folder", help="where to write server.key(_secret) and client.key(_secret)")
    p.set_defaults(func=lambda a: print(f"keys in {curve.make_keys(a.folder)}; copy the folder to every host") or 0)

    from producers import dali_source, dataset, decode

    for module in (dataset, decode, dali_source):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
