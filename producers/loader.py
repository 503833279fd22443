"""`python -m producers loader --loader MODULE:CALLABLE`: the user's own loader as producer processes.

Each worker process calls the loader's callable itself (its own copy: its
own DataLoader workers, its own tf.data runtime) with its own shard of the
seed, converts what it yields to uint8 NHWC images and int32 labels
(`core.loader_spec`), and pushes the batches like any other producer: to
any consumer path, over any transport, on this machine or another.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from core import loader_start
from core.cli_types import positive_float, positive_int
from core.loader_spec import DEFAULT_TIMEOUT, LoaderError, LoaderSpec, batches, worker_seed
from producers.options import add_send_args, run_producer


@dataclass(frozen=True)
class LoaderSource:
    """Batches from the user's loader, built anew in each worker process (picklable)."""

    spec: LoaderSpec
    batch: int = 64  # for a loader that yields samples
    expect_batch: int | None = None  # the model's batch; None: take the loader's
    expect_size: int | None = None  # the model's image size; None: take the loader's
    seed: int = 0
    first_id: int = 0  # producer id of worker 0 (the seed shard follows the id)
    workers: int = 1
    timeout: float = DEFAULT_TIMEOUT

    def __call__(self, worker: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        pid = self.first_id + worker
        return batches(
            self.spec,
            self.batch,
            self.expect_batch,
            self.expect_size,
            seed=worker_seed(self.seed, pid),
            worker=worker,
            num_workers=self.workers,
            timeout=self.timeout,
        )

    @property
    def start_method(self) -> str:
        """The workers are copies of this process where that is safe (core/loader_start.py), else spawned."""
        return loader_start.start_method()

    def describe(self) -> str:
        return f"loader {self.spec.name}"


def _run(args: argparse.Namespace) -> int:
    try:
        if args.reuse_unchanged_slots:
            raise LoaderError(
                "--reuse-unchanged-slots is for synthetic sources whose arrays never change; "
                "a loader's batches are written into their slots anew (drop the flag)"
            )
        spec = LoaderSpec.parse(args.loader, args.loader_arg)
        spec.resolve()  # a wrong module or name is one line here, before any worker starts
    except LoaderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    source = LoaderSource(
        spec,
        batch=args.batch or 64,
        expect_batch=args.batch,
        expect_size=args.image_size,
        seed=args.seed,
        first_id=args.producer_id,
        workers=args.workers,
        timeout=args.loader_timeout,
    )
    return run_producer(source, args, source.describe())


def add_loader_args(p, required: bool = True) -> None:
    """--loader, --loader-arg and --loader-timeout (also bench_input.py's)."""
    p.add_argument(
        "--loader", required=required, metavar="MODULE:CALLABLE",
        help="a file path or importable module, and the callable in it that returns the loader "
        "(batches, a torch Dataset or DataLoader, a tf.data.Dataset or a tensorpack DataFlow)",
    )  # fmt: skip
    p.add_argument(
        "--loader-arg", action="append", default=[], metavar="KEY=VALUE",
        help="a keyword argument for the callable (a Python literal, or else text); repeat for more",
    )  # fmt: skip
    p.add_argument(
        "--loader-timeout", type=positive_float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"a loader that yields nothing for this long is hung (default {DEFAULT_TIMEOUT:g})",
    )  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("loader", help="run your own loader (MODULE:CALLABLE) and push its batches")
    add_send_args(p)
    add_loader_args(p)
    p.add_argument("--batch", type=positive_int, help="images per batch the consumer expects (checked; default: any)")
    p.add_argument("--image-size", type=positive_int, help="image height and width the consumer expects (checked)")
    p.add_argument("--seed", type=int, default=0, help="base seed; each worker gets its own shard of it")
    p.set_defaults(func=_run)
