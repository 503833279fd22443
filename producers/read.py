"""`python -m producers read`: read an ImageNet-layout folder and push each batch's JPEG files as they are.

The producer side of decoding on the GPU (the gpu-decode path): the host's
work per image is reading its bytes; the consumer decodes, crops and resizes
on its device. Each batch is three tensors: the files' bytes (a byte-string
tensor, wire/strings.py), int32 labels and int64 file indices (the file's
place in the folder's sorted list, so the consumer can name a file it cannot
decode and count what it was given). `--shard K/N` takes every N-th file from
the K-th, so N producers share one pass over the folder; workers share a
producer's shard the same way, and each pass is shuffled anew.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.images.files import DatasetError, list_images, read_file
from producers.decode import add_data_args
from producers.options import add_send_args, run_producer
from wire import strings

JPEG_SOI = b"\xff\xd8"
MAX_NAMED = 1000  # skipped files listed in a header (its extras stay far below the 64 KiB limit)
WARN_FIRST = 3  # skipped files named on stderr per worker


class NotJpegError(RuntimeError):
    """A file that is not a JPEG (with --on-bad-file fail)."""


def shard_of(n: int, index: int, count: int) -> list[int]:
    """The file indices of shard `index` of `count` over n files (every count-th file)."""
    return list(range(index, n, count))


@dataclass(frozen=True)
class ReadSource:
    """Batches of encoded files from an ImageNet-layout folder; picklable, each worker lists its own share."""

    root: str
    list_file: str | None = None
    batch: int = 64
    workers: int = 1
    seed: int = 0
    shard: tuple[int, int] = (0, 1)  # (index, count) over the run's producers
    on_bad_file: str = "skip"  # or "fail"
    skipped: Any = field(default=None, compare=False, repr=False)  # per worker: a list, filled as files are skipped

    def header_extras(self, worker: int) -> dict[str, Any]:
        """The files this worker skipped so far (the first MAX_NAMED), in each native header."""
        bad = self.skipped[worker] if self.skipped is not None else []
        return {"bad_files": len(bad), "skipped_files": bad[:MAX_NAMED]} if bad else {}

    def files(self, worker: int) -> tuple[list[str], list[int], list[int]]:
        """(paths, labels, this worker's file indices)."""
        files, labels, _ = list_images(self.root, self.list_file)
        index, count = self.shard
        mine = shard_of(len(files), index, count)[worker :: self.workers]
        if not mine:
            raise DatasetError(
                f"{len(files)} images in {self.root}: none left for worker {worker} of shard {index}/{count}"
            )
        return files, labels, mine

    def __call__(self, worker: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        files, labels, mine = self.files(worker)
        root = str(Path(self.root))
        items: list[bytes] = []
        taken: list[int] = []
        skipped = self.skipped[worker] if self.skipped is not None else []
        for epoch in range(sys.maxsize):
            random.Random(f"{self.seed}/{self.shard[0]}/{worker}/{epoch}").shuffle(mine)
            for i in mine:
                data = read_file(f"{root}/{files[i]}")
                if not data.startswith(JPEG_SOI):
                    self._not_jpeg(f"{root}/{files[i]}", data, len(skipped))
                    skipped.append(i)
                    continue
                items.append(data)
                taken.append(i)
                if len(items) == self.batch:
                    yield strings.of(items), np.array([labels[k] for k in taken], np.int32), np.array(taken, np.int64)
                    items, taken = [], []
            gone = set(skipped)
            mine = [i for i in mine if i not in gone]
            if not mine:
                raise NotJpegError(f"worker {worker}: no file of its shard of {self.root} is a JPEG; nothing to send")

    def _not_jpeg(self, path: str, data: bytes, before: int) -> None:
        """Stop (--on-bad-file fail) or name the first few skipped files."""
        why = f"not a JPEG (starts with {data[:4]!r})"
        if self.on_bad_file == "fail":
            raise NotJpegError(f"{path}: {why} (--on-bad-file skip skips such files)")
        if before < WARN_FIRST:
            more = "; further files that are not JPEGs are only counted" if before + 1 == WARN_FIRST else ""
            print(f"warning: skipping {path}: {why}{more}", file=sys.stderr, flush=True)

    def describe(self) -> str:
        index, count = self.shard
        return f"read {self.root} (shard {index}/{count}) -> batches of {self.batch} JPEG files, undecoded"


def largest_batch(root: str, list_file: str | None, batch: int) -> int:
    """Bytes of a batch of the `batch` largest files, with its length table, labels and indices (each
    64-byte aligned in a slot): what a shm:// slot must hold, at most."""
    files, _, _ = list_images(root, list_file)
    sizes = sorted((os.stat(f"{root}/{f}").st_size for f in files), reverse=True)
    return sum(sizes[:batch]) + (8 + 4 + 8) * batch + 3 * 64


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N` with 0 <= K < N (argparse type)."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected K/N, e.g. 0/2") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: K must be in 0..N-1")
    return k, n


def _run(args: argparse.Namespace) -> int:
    try:
        files, _, _ = list_images(args.data, args.list)
        if len(shard_of(len(files), *args.shard)) < args.workers:
            raise DatasetError(f"{len(files)} images in {args.data}: shard {args.shard[0]}/{args.shard[1]} "
                               f"cannot be shared by {args.workers} workers")  # fmt: skip
        if args.endpoint.startswith("shm://") and args.shm_slot_bytes is None:
            args.shm_slot_bytes = largest_batch(args.data, args.list, args.batch)
    except (DatasetError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    skipped = [[] for _ in range(args.workers)]  # workers are processes: each reports its own in its headers
    source = ReadSource(
        args.data, args.list, args.batch, args.workers, args.seed, args.shard, args.on_bad_file, skipped
    )
    return run_producer(source, args, source.describe())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("read", help="read JPEG files from a folder and push them undecoded (decoded on the GPU)")
    add_send_args(p)
    add_data_args(p)
    p.add_argument(
        "--on-bad-file", choices=("skip", "fail"), default="skip",
        help="a file that is not a JPEG: skip it, naming the first few (default), or stop",
    )  # fmt: skip
    p.add_argument(
        "--shard", type=parse_shard, default=(0, 1), metavar="K/N", help="read every N-th file from the K-th"
    )
    p.set_defaults(func=_run)
