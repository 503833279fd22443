"""The flags every producer shares (where and how it sends), and running a producer from them.

Each producer kind's module (synthetic in cli.py, decode.py, dali_source.py)
adds these to its subcommand and hands its source to `run_producer`.
"""

from __future__ import annotations

import argparse
import sys

from core.cli_types import non_negative_float, positive_float, positive_int
from producers import launcher
from producers.sender import SendConfig
from wire import curve
from wire.endpoints import EndpointError, check, check_reachable
from wire.message import FORMATS


def add_send_args(p: argparse.ArgumentParser) -> None:
    """The flags every producer shares: where and how it sends, and how many workers."""
    g = p.add_argument_group("sending")
    g.add_argument("--endpoint", required=True, help="ZMQ endpoint, e.g. ipc:///tmp/feed or tcp://127.0.0.1:5555")
    g.add_argument("--bind", action="store_true", help="bind the endpoint (default: connect; the consumer binds)")
    g.add_argument(
        "--wire-format", dest="format", choices=FORMATS, default="native", help="wire format (default: native)"
    )
    g.add_argument("--hwm", type=positive_int, default=4, help="ZMQ send high-water mark, in batches")
    g.add_argument(
        "--shm-slots", type=positive_int, default=None, metavar="N",
        help="shm://: slots in each worker's region (default: hwm + 8, room for batches a consumer holds "
        "in prefetch or staging while it uses them in place)",
    )  # fmt: skip
    g.add_argument(
        "--reuse-unchanged-slots", action="store_true",
        help="shm://: do not rewrite a slot that already holds the very same read-only arrays (a synthetic "
        "pool); off by default, so every batch is written anew as a decoding producer must",
    )  # fmt: skip
    g.add_argument(
        "--shm-slot-bytes", type=positive_int, default=None, metavar="N",
        help="shm://: bytes each slot holds at least (default: the first batch's size; the read producer: "
        "its largest possible batch)",
    )  # fmt: skip
    g.add_argument("--workers", type=positive_int, default=1, help="worker processes")
    g.add_argument("--count", type=positive_int, default=None, help="total batches to send (default: until stopped)")
    g.add_argument("--rate", type=positive_float, default=None, help="cap each worker at this many images/s")
    g.add_argument("--producer-id", type=int, default=0, help="id of worker 0; worker i sends as id+i")
    g.add_argument(
        "--give-up-after", type=non_negative_float, default=60.0, metavar="SECONDS",
        help="once a consumer has taken a batch, stop when none takes one for this many seconds "
        "(default: 60; 0: never). Before its first consumer a producer waits as long as it is left running",
    )  # fmt: skip
    g.add_argument("--allow-remote", action="store_true", help="allow binding a non-loopback address (unauthenticated)")
    g.add_argument(
        "--curve-keys", metavar="DIR", help="encrypt and authenticate with the CURVE keys in DIR (see make-keys)"
    )
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument(
        "--busy-wait", action="store_true", help="spin while the consumer has no room (a polling loader: uses a core)"
    )
    g.add_argument(
        "--stats-file", metavar="PATH",
        help="write this producer's figures (images/s, bytes/s, send latency) here as JSON once a second",
    )  # fmt: skip


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
        shm_slots=args.shm_slots,
        reuse_unchanged_slots=args.reuse_unchanged_slots,
        shm_slot_bytes=args.shm_slot_bytes,
    )


def run_producer(source, args: argparse.Namespace, describe: str) -> int:
    """Check the endpoint up front, then run the workers; one line on any error."""
    try:
        if args.curve_keys:
            curve.check_folder(args.curve_keys, server=args.bind)
        check(args.endpoint, args.bind, args.allow_remote, secured=bool(args.curve_keys))
        check_reachable(args.endpoint)
        if args.bind and args.workers > 1:
            raise EndpointError(
                f"endpoint {args.endpoint!r}: --bind takes one worker; with --workers {args.workers}, "
                "let the consumer bind and the producer connect"
            )
    except (EndpointError, curve.CurveError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return launcher.launch(
        source, send_config(args), args.workers, progress=not args.quiet, describe=describe, stats_file=args.stats_file
    )
