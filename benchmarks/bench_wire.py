"""`python -m benchmarks bench-wire`: how fast batches cross the wire, Python to Python.

A real producer process pushes 64x224x224x3 uint8 batches; a Python
PullConsumer in this process receives them. Each transport and format is
timed over several repeats, and compared with single-core memcpy bandwidth
measured in the same run. Over shm:// the consumer's one copy is out of the
producer's shared-memory slot (the Python consumer copies; the op and the
native receiver copy straight into their tensors).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

from tabulate import tabulate

from benchmarks.memcpy import memcpy_bandwidth
from consumers.zmq_pull import PullConsumer
from core.cli_types import positive_int
from producers.commands import producer_command
from profiler.summary import Summary
from wire.endpoints import free_tcp_port


def start_producer(
    endpoint: str, fmt: str, count: int, batch: int, image_size: int, workers: int = 1
) -> subprocess.Popen:
    """A real `python -m producers synthetic` process pushing to `endpoint`."""
    cmd = producer_command(
        "synthetic", endpoint, batch, image_size, workers=workers, fmt=fmt, count=count, extra=["--give-up-after", "30"]
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.Popen(cmd, cwd=root)


def measure(endpoint: str, fmt: str, args: argparse.Namespace) -> dict:
    """Receive warm-up batches, then time `repeats` windows of `batches` batches each."""
    total = args.warmup + args.repeats * args.batches
    proc = None
    try:
        with PullConsumer(endpoint, bind=True, hwm=args.hwm, recv_timeout=60) as consumer:
            proc = start_producer(endpoint, fmt, total, args.batch, args.image_size)
            for _ in range(args.warmup):
                consumer.recv()
            rates, ips = [], []
            for _ in range(args.repeats):
                b0 = consumer.bytes
                t0 = time.perf_counter()
                for _ in range(args.batches):
                    batch = consumer.recv()
                    batch.arrays[0][::97, ::53, ::31].sum()  # touch the data, a little
                dt = time.perf_counter() - t0
                rates.append((consumer.bytes - b0) / dt)
                ips.append(args.batches * args.batch / dt)
        proc.wait(30)  # the producer leaves once its consumer has hung up
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"bytes_per_sec": Summary.of(rates), "images_per_sec": Summary.of(ips)}


def run(args: argparse.Namespace) -> int:
    memcpy = memcpy_bandwidth()
    rows = []
    with tempfile.TemporaryDirectory(prefix="feedbench-wire-") as tmp:
        for transport in args.transports:
            for fmt in args.formats:
                if transport == "shm":
                    if fmt != "native":
                        continue  # slot messages are native headers
                    endpoint = f"shm://wire-{os.getpid()}-{fmt}"
                elif transport == "ipc":
                    endpoint = f"ipc://{tmp}/{fmt}"
                else:
                    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
                r = measure(endpoint, fmt, args)
                bw = r["bytes_per_sec"]
                rows.append(
                    [
                        transport,
                        fmt,
                        bw.scaled(1e-9).fmt(".2f"),
                        r["images_per_sec"].fmt(".0f"),
                        f"{bw.median / memcpy.median:.2f}",
                    ]
                )
    print(
        f"\nWire: python -m producers synthetic -> Python PullConsumer, {args.batch}x{args.image_size}x{args.image_size}x3 "
        f"uint8 batches; median (min–max) of {args.repeats} repeats of {args.batches} batches"
    )
    print(f"Same-run single-core memcpy: {memcpy.scaled(1e-9).fmt('.2f')} GB/s\n")
    print(tabulate(rows, headers=["transport", "format", "GB/s", "images/s", "ratio to memcpy"]))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-wire", help="benchmark the wire: producer process -> Python puller")
    p.add_argument("--batch", type=positive_int, default=64, help="images per batch")
    p.add_argument("--image-size", type=positive_int, default=224, help="image height and width")
    p.add_argument("--batches", type=positive_int, default=40, help="batches per timed repeat")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats; the median is reported")
    p.add_argument("--warmup", type=positive_int, default=10, help="batches before timing starts")
    p.add_argument("--hwm", type=positive_int, default=4, help="ZMQ high-water mark, in batches")
    p.add_argument(
        "--transports",
        nargs="+",
        choices=("shm", "ipc", "tcp"),
        default=["shm", "ipc", "tcp"],
        help="transports to time",
    )
    p.add_argument(
        "--formats",
        nargs="+",
        choices=("native", "zmq_ops"),
        default=["native", "zmq_ops"],
        help="wire formats to time",
    )
    p.set_defaults(func=run)
