"""`python -m producers decode`: read an ImageNet-layout folder, decode, crop, batch, push.

The standard ImageNet training input in plain Python: each worker process
takes its own shard of the (per-epoch shuffled) file list, decodes each JPEG,
takes an Inception-style random-resized crop with a random horizontal flip,
and fills uint8 NHWC batches with int32 labels (class = index of the sorted
sub-folder name). The decoding stack is simplejpeg (libjpeg-turbo) with
scaled decoding and OpenCV resizing; docs/decoding.md says why.

A file that cannot be decoded as a JPEG is skipped and counted (or stops the
producer, with --on-bad-file fail); a batch is always full, the next files
fill in for skipped ones.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.cli_types import positive_int
from core.images.decoders import DECODERS, DEFAULT_DECODER, stage_ms, stage_seconds, with_pillow_fallback
from core.images.files import DatasetError, list_images, read_file
from core.images.jpeg_roi import library
from core.images.jpeg_roi.build import BuildError
from producers.cold_cache import drop_pages
from producers.options import add_send_args, run_producer

WARN_FIRST = 3  # bad files named on stderr per worker; the rest are only counted


class BadFileError(RuntimeError):
    """A file is not a decodable JPEG (raised with --on-bad-file fail)."""


# --------------------------------------------------------------------------- the source


def _timed_read(path: str) -> bytes:
    """The file's bytes; the read's wall time goes to the `read` stage (storage waits use no CPU)."""
    t0 = time.perf_counter()
    data = read_file(path)
    stage_seconds["read"] += time.perf_counter() - t0
    return data


@dataclass(frozen=True)
class DecodeSource:
    """Batches decoded from an ImageNet-layout folder; picklable, each worker lists and shards it itself."""

    root: str
    list_file: str | None = None
    batch: int = 64
    image_size: int = 224
    workers: int = 1
    seed: int = 0
    on_bad_file: str = "skip"  # or "fail"
    decoder: str = DEFAULT_DECODER
    # Give JPEGs the fast stack rejects (CMYK, say) a second chance in Pillow. Not for the ROI decoder: it reads
    # CMYK itself, and Pillow would decode a file it refused for its size without bounding memory.
    fallback: bool = True
    # One slot per worker: bad files so far, read by the parent for its final report.
    bad_counts: Any = field(default=None, compare=False, repr=False)

    def header_extras(self, worker: int) -> dict[str, Any]:
        """Counters this source adds to each native header (the sender asks before every send)."""
        extras: dict[str, Any] = {"bad_files": int(self.bad_counts[worker])} if self.bad_counts is not None else {}
        if stages := stage_ms():
            extras["stage_ms"] = {k: round(v, 4) for k, v in stages.items()}
        return extras

    # The sender may hand us buffers to decode into (shm:// slots): no copy after decoding.
    fills_buffers = True

    def __call__(
        self, worker: int, buffers: Callable[[], list[np.ndarray] | None] | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        files, labels, _ = list_images(self.root, self.list_file)
        if len(files) < self.workers:
            raise DatasetError(f"{len(files)} images in {self.root} cannot be shared by {self.workers} workers")
        root = str(Path(self.root))
        decode = self._decode_function()
        rng = random.Random(f"{self.seed}/{worker}")  # augmentation: different in every worker
        # A fixed shard per worker (every workers-th file), reshuffled every epoch: each file has one
        # owner, so a bad file is counted once and dropped from later epochs.
        shard = list(range(worker, len(files), self.workers))
        bad: set[int] = set()
        size = self.image_size
        shape = (self.batch, size, size, 3)

        def fresh() -> tuple[np.ndarray, np.ndarray]:
            out = buffers() if buffers is not None else None
            if out is not None and out[0].shape == shape and out[1].shape == (self.batch,):
                return out[0], out[1]
            return np.empty(shape, np.uint8), np.empty(self.batch, np.int32)

        images, batch_labels = fresh()
        k = 0
        for epoch in range(sys.maxsize):
            random.Random(f"{self.seed}/{worker}/{epoch}").shuffle(shard)
            for i in shard:
                path = f"{root}/{files[i]}"  # a third of the cost of joining Paths
                try:
                    decode(_timed_read(path), rng, images[k])
                except Exception as e:
                    if self.on_bad_file == "fail":
                        raise BadFileError(f"cannot decode {path}: {e} (--on-bad-file skip skips such files)") from None
                    bad.add(i)
                    if self.bad_counts is not None:
                        self.bad_counts[worker] = len(bad)
                    if len(bad) <= WARN_FIRST:
                        more = "; further bad files are only counted" if len(bad) == WARN_FIRST else ""
                        print(f"warning: skipping {path}: {e}{more}", file=sys.stderr, flush=True)
                    continue
                batch_labels[k] = labels[i]
                k += 1
                if k == self.batch:
                    # The sender hands these arrays to ZMQ without copying: never write them again.
                    yield images, batch_labels
                    images, batch_labels = fresh()
                    k = 0
            if bad:
                shard = [i for i in shard if i not in bad]
            if not shard:
                raise BadFileError(f"worker {worker}: no file of its shard of {self.root} decodes; nothing to send")

    def _decode_function(self) -> Callable[[bytes, random.Random, np.ndarray], None]:
        """This source's stack; the ROI decoder's library is built (or found) first."""
        if self.decoder.startswith("roi"):
            library()  # a failed build stops the worker here, not as every file counted bad
            return DECODERS[self.decoder]  # it reads CMYK itself: no Pillow fallback
        decode = DECODERS[self.decoder]
        return with_pillow_fallback(decode) if self.fallback else decode

    def describe(self) -> str:
        return f"decode {self.root} -> {self.batch}x{self.image_size}x{self.image_size}x3 uint8 ({self.decoder})"


# --------------------------------------------------------------------------- command line


def check_dataset(
    root: str, list_file: str | None, workers: int, cold_cache: bool = False
) -> tuple[list[str], list[int], list[str]]:
    """List the dataset once up front, so a bad folder is one line and exit code 2, not N worker errors; the
    listing (files, labels, classes: core/images/files.py `list_images`).

    Class folders that cannot be read are skipped and counted on stderr, as bad files are; with `cold_cache`
    the files' pages are dropped (producers/cold_cache.py) and the files that cannot be read counted too.
    """
    folders: list[str] = []
    files, labels, classes = list_images(root, list_file, folders)
    if folders:
        print(f"warning: skipping {say_skipped(len(folders), 'unreadable class folder')}: {', '.join(folders[:3])}"
              f"{', ...' if len(folders) > 3 else ''}", file=sys.stderr, flush=True)  # fmt: skip
    if len(files) < workers:
        raise DatasetError(f"{len(files)} images in {root} cannot be shared by {workers} workers")
    if cold_cache:
        unreadable: list[str] = []
        drop_pages((Path(root) / f for f in files), unreadable)
        if unreadable:
            print(f"warning: --cold-cache: {say_skipped(len(unreadable), 'file')} that cannot be read "
                  f"(e.g. {unreadable[0]}): the decoders skip and count them", file=sys.stderr, flush=True)  # fmt: skip
    return files, labels, classes


def say_skipped(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _run(args: argparse.Namespace) -> int:

    try:
        check_dataset(args.data, args.list, args.workers, args.cold_cache)
        if args.decoder.startswith("roi"):
            library()  # built once here, before the workers start
    except (DatasetError, BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import multiprocessing as mp

    bad_counts = mp.get_context("spawn").RawArray("q", args.workers)
    source = DecodeSource(
        root=args.data,
        list_file=args.list,
        batch=args.batch,
        image_size=args.image_size,
        workers=args.workers,
        seed=args.seed,
        on_bad_file=args.on_bad_file,
        decoder=args.decoder,
        bad_counts=bad_counts,
    )
    code = run_producer(source, args, source.describe())
    bad = sum(bad_counts)
    if bad:
        print(f"decode: skipped {say_skipped(bad, 'bad file')} (unreadable, or not decodable as JPEG)", file=sys.stderr)
    return code


def add_data_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by the decoding producers (Python and DALI)."""
    p.add_argument("--data", required=True, metavar="DIR", help="ImageNet-layout folder: DIR/<class>/<image>.JPEG")
    p.add_argument("--list", metavar="FILE", help="use only these files: lines of 'relative/path [label]'")
    p.add_argument("--image-size", type=positive_int, default=224, help="output height and width")
    p.add_argument("--batch", type=positive_int, default=64, help="images per batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle and the augmentation")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode", help="decode JPEGs from a folder, random-resized-crop, push batches")
    add_send_args(p)
    add_data_args(p)
    p.add_argument(
        "--on-bad-file",
        choices=("skip", "fail"),
        default="skip",
        help="a file that is not a decodable JPEG: skip and count it (default), or stop",
    )
    p.add_argument("--decoder", choices=sorted(DECODERS), default=DEFAULT_DECODER, help="decoding stack")
    p.add_argument(
        "--cold-cache",
        action="store_true",
        help="drop the dataset's files from the page cache first, so the run reads them from storage",
    )
    p.set_defaults(func=_run)
