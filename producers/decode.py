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
import io
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from core.cli_types import positive_int
from producers.cold_cache import drop_pages
from producers.jpeg_roi import RoiDecoder, halve, library
from producers.jpeg_roi.build import BuildError
from producers.options import add_send_args, run_producer

JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")
WARN_FIRST = 3  # bad files named on stderr per worker; the rest are only counted

cv2.setNumThreads(1)  # one worker is one core; parallelism comes from worker processes


class DatasetError(ValueError):
    """The data folder or list cannot be used; the message names the path."""


class BadFileError(RuntimeError):
    """A file is not a decodable JPEG (raised with --on-bad-file fail)."""


# --------------------------------------------------------------------------- listing


def class_folders(root: Path) -> list[str]:
    """Sorted class sub-folder names of an ImageNet-layout folder; DatasetError if unusable."""
    if not root.exists():
        raise DatasetError(f"dataset folder {root} does not exist")
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} is not a folder")
    entries = [e for e in root.iterdir() if not e.name.startswith(".")]
    if not entries:
        raise DatasetError(f"dataset folder {root} is empty")
    classes = sorted(e.name for e in entries if e.is_dir())
    if not classes:
        raise DatasetError(f"dataset folder {root} has no class sub-folders (expected {root}/<class>/<image>.JPEG)")
    return classes


def list_images(root: str | Path, list_file: str | Path | None = None) -> tuple[list[str], list[int], list[str]]:
    """(relative paths, labels, class names) of the dataset, in a fixed order every worker agrees on.

    Without a list, every file with a JPEG suffix in a class folder is used.
    With one, each line is `relative/path [label]` (DALI's file_list format);
    a missing label is the index of the path's class folder.
    """
    root = Path(root)
    classes = class_folders(root)
    index = {c: i for i, c in enumerate(classes)}
    files: list[str] = []
    labels: list[int] = []
    if list_file is None:
        for c in classes:
            for name in sorted(e.name for e in (root / c).iterdir() if e.is_file()):
                if name.lower().endswith(JPEG_SUFFIXES) and not name.startswith("."):
                    files.append(f"{c}/{name}")
                    labels.append(index[c])
        if not files:
            raise DatasetError(f"dataset folder {root} has no JPEG files in its {len(classes)} class sub-folders")
        return files, labels, classes
    try:
        lines = Path(list_file).read_text().splitlines()
    except OSError as e:
        raise DatasetError(f"cannot read file list {list_file}: {e.strerror or e}") from None
    for n, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        path = parts[0]
        if len(parts) > 1:
            try:
                label = int(parts[1])
            except ValueError:
                raise DatasetError(f"{list_file}:{n}: label {parts[1]!r} is not an integer") from None
        elif path.split("/")[0] in index:
            label = index[path.split("/")[0]]
        else:
            raise DatasetError(f"{list_file}:{n}: {path} has no label and is not in a class folder of {root}")
        files.append(path)
        labels.append(label)
    if not files:
        raise DatasetError(f"file list {list_file} names no files")
    return files, labels, classes


# --------------------------------------------------------------------------- augmentation


def random_resized_crop_box(
    height: int,
    width: int,
    rng: random.Random,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """(top, left, height, width) of an Inception-style crop: random area share and aspect ratio.

    Ten tries at a crop that fits, then the whole image clipped to the ratio
    range (torchvision's RandomResizedCrop, which DALI's follows too).
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        h, w = height, width
    h, w = min(h, height), min(w, width)
    return (height - h) // 2, (width - w) // 2, h, w


def _crop_bounds(shape: tuple[int, ...], box: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1): the whole pixels of an image of `shape` that `box` (top, left, height, width) touches."""
    top, left, h, w = box
    y0, x0 = int(top), int(left)
    return y0, min(shape[0], max(y0 + 1, math.ceil(top + h))), x0, min(shape[1], max(x0 + 1, math.ceil(left + w)))


def _resize_flip(crop: np.ndarray, out: np.ndarray, flip: bool) -> None:
    """Resize `crop` into `out`, antialiased, and mirror it if asked."""
    # INTER_AREA averages when shrinking (like DALI's antialiased linear resize) and is bilinear when growing.
    cv2.resize(crop, (out.shape[1], out.shape[0]), dst=out, interpolation=cv2.INTER_AREA)
    if flip:
        cv2.flip(out, 1, dst=out)


def _crop_resize_flip(img: np.ndarray, box: tuple[float, float, float, float], out: np.ndarray, flip: bool) -> None:
    """Cut `box` (top, left, height, width in `img`'s pixels) and resize it into `out`, antialiased."""
    y0, y1, x0, x1 = _crop_bounds(img.shape, box)
    _resize_flip(img[y0:y1, x0:x1], out, flip)


# --------------------------------------------------------------------------- decoding stacks
#
# Each takes the file's bytes, draws its crop and flip from `rng`, and writes
# an out.shape image into `out`. All decode below full size when the crop
# will be shrunk by 2x or more anyway (libjpeg's DCT scaling).


def _reduced_scale(crop_h: int, crop_w: int, size: int) -> float:
    """The factor a decode may shrink the image by and still leave the crop at least `size` pixels."""
    return min(crop_h, crop_w) / size


def _decode_simplejpeg(fast: bool) -> Callable[[bytes, random.Random, np.ndarray], None]:
    def decode(data: bytes, rng: random.Random, out: np.ndarray) -> None:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        top, left, h, w = random_resized_crop_box(height, width, rng)
        shrink = _reduced_scale(h, w, out.shape[0])
        # min_factor=2: only the 1/2, 1/4, 1/8 scalings, which libjpeg-turbo has SIMD code for;
        # its other factors (7/8, 3/4, ...) decode slower than full size (docs/decoding.md).
        img = simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            fastdct=fast,
            fastupsample=fast,
            min_height=math.ceil(height / shrink),
            min_width=math.ceil(width / shrink),
            min_factor=2,
        )
        f = img.shape[1] / width
        _crop_resize_flip(img, (top * f, left * f, h * f, w * f), out, rng.random() < 0.5)

    return decode


def _dct_denominator(height: int, width: int, shrink: float) -> int:
    """The largest of 8, 4, 2 whose scaled image still leaves the crop `shrink`-times reduced (else 1).

    The same choice as simplejpeg's min_height/min_width with min_factor=2.
    """
    need_h, need_w = math.ceil(height / shrink), math.ceil(width / shrink)
    return next((k for k in (8, 4, 2) if -(-height // k) >= need_h and -(-width // k) >= need_w), 1)


# Seconds per stage of the ROI decoder in this process (CPU time of the decoding thread; the read's wall
# time), and the images they add up over.
STAGES = ("read", "header", "start", "skip", "rows", "resize", "flip")
stage_seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
stage_images = [0]


def stage_ms() -> dict[str, float]:
    """Milliseconds per image of each stage so far in this process; empty before the ROI decoder's first image."""
    n = stage_images[0]
    return {k: 1e3 * v / n for k, v in stage_seconds.items() if v} if n else {}


def reset_stages() -> None:
    """Start the per-stage counts afresh (a benchmark times each stack apart)."""
    for k in stage_seconds:
        stage_seconds[k] = 0.0
    stage_images[0] = 0


def _shrink_into(crop: np.ndarray, out: np.ndarray) -> None:
    """Resize a decoded crop into `out`, antialiased wherever it is shrunk 2x or more.

    After DCT scaling a crop is seldom shrunk 2x or more: then every pixel lies under a bilinear tap and
    INTER_LINEAR is as good as INTER_AREA at a sixth of its cost. An axis shrunk 2-4x (the long side of a
    non-square crop, mostly) is first halved by averaging pixel pairs, then resized bilinearly; a crop
    shrunk 4x or more gets INTER_AREA (docs/decoding.md).
    """
    (ch, cw), (oh, ow) = crop.shape[:2], out.shape[:2]
    interpolation = cv2.INTER_LINEAR
    if ch >= 2 * oh or cw >= 2 * ow:
        if ch < 4 * oh and cw < 4 * ow:
            crop = halve(crop, 1 + (ch >= 2 * oh), 1 + (cw >= 2 * ow))
        else:
            interpolation = cv2.INTER_AREA
    cv2.resize(crop, (ow, oh), dst=out, interpolation=interpolation)


def _decode_roi(fast: bool) -> Callable[[bytes, random.Random, np.ndarray], None]:
    """Decode only the crop: its rows and its (iMCU-widened) columns, DCT-scaled when it is shrunk 2x or more."""

    def decode(data: bytes, rng: random.Random, out: np.ndarray) -> None:
        t0 = time.thread_time()
        if not data.startswith(b"\xff\xd8"):
            _open_jpeg(data)  # says what the file is instead ("not a JPEG but PNG")
        dec = RoiDecoder.for_thread()
        hd = dec.header(data)
        top, left, h, w = random_resized_crop_box(hd.height, hd.width, rng)
        denom = _dct_denominator(hd.height, hd.width, _reduced_scale(h, w, out.shape[0]))
        scaled = (-(-hd.height // denom), -(-hd.width // denom))
        f = scaled[1] / hd.width
        y0, y1, x0, x1 = _crop_bounds(scaled, (top * f, left * f, h * f, w * f))
        crop = dec.decode(denom, (y0, y1), (x0, x1), fast)
        t2 = time.thread_time()
        _shrink_into(crop, out)
        t3 = time.thread_time()
        if rng.random() < 0.5:
            cv2.flip(out, 1, dst=out)
        t4 = time.thread_time()
        s = stage_seconds
        start, skip, rows = dec.times
        s["header"] += max(0.0, t2 - t0 - start - skip - rows)  # the calls' own cost counted with the header
        s["start"] += start
        s["skip"] += skip
        s["rows"] += rows
        s["resize"] += t3 - t2
        s["flip"] += t4 - t3
        stage_images[0] += 1

    return decode


class NotJpegError(ValueError):
    """The bytes are some other kind of file (or no image at all)."""


def _open_jpeg(data: bytes) -> Image.Image:
    """Pillow's lazy view of a JPEG (reads the header only); NotJpegError for anything else."""
    try:
        im = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise NotJpegError("not an image file") from None
    if im.format != "JPEG":
        raise NotJpegError(f"not a JPEG but {im.format}")
    return im


def _decode_pillow(data: bytes, rng: random.Random, out: np.ndarray) -> None:
    im = _open_jpeg(data)
    width, height = im.size
    top, left, h, w = random_resized_crop_box(height, width, rng)
    shrink = _reduced_scale(h, w, out.shape[0])
    im.draft("RGB", (math.ceil(width / shrink), math.ceil(height / shrink)))  # libjpeg DCT scaling
    im = im.convert("RGB")
    f = im.size[0] / width
    box = (left * f, top * f, min(im.size[0], (left + w) * f), min(im.size[1], (top + h) * f))
    im = im.resize((out.shape[1], out.shape[0]), Image.Resampling.BILINEAR, box=box)
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out[...] = np.asarray(im)


# The REDUCED_GRAYSCALE_k flags carry only the scale bits; IMREAD_COLOR_RGB adds RGB channel order.
_CV2_REDUCED = (
    (8, cv2.IMREAD_REDUCED_GRAYSCALE_8 | cv2.IMREAD_COLOR_RGB),
    (4, cv2.IMREAD_REDUCED_GRAYSCALE_4 | cv2.IMREAD_COLOR_RGB),
    (2, cv2.IMREAD_REDUCED_GRAYSCALE_2 | cv2.IMREAD_COLOR_RGB),
)


def _decode_opencv(data: bytes, rng: random.Random, out: np.ndarray) -> None:
    im = _open_jpeg(data)  # OpenCV cannot tell the size without decoding
    width, height = im.size
    top, left, h, w = random_resized_crop_box(height, width, rng)
    shrink = _reduced_scale(h, w, out.shape[0])
    flag = next((flag for k, flag in _CV2_REDUCED if shrink >= k), cv2.IMREAD_COLOR_RGB)
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if img is None:
        raise ValueError("OpenCV could not decode it")
    f = img.shape[1] / width
    _crop_resize_flip(img, (top * f, left * f, h * f, w * f), out, rng.random() < 0.5)


DECODERS: dict[str, Callable[[bytes, random.Random, np.ndarray], None]] = {
    "roi": _decode_roi(fast=True),
    "roi-exact": _decode_roi(fast=False),
    "simplejpeg": _decode_simplejpeg(fast=True),
    "simplejpeg-exact": _decode_simplejpeg(fast=False),
    "pillow": _decode_pillow,
    "opencv": _decode_opencv,
}
DEFAULT_DECODER = "roi"


def _decode_with_pillow_fallback(
    decode: Callable[[bytes, random.Random, np.ndarray], None],
) -> Callable[[bytes, random.Random, np.ndarray], None]:
    """Try the fast stack; a JPEG it cannot handle (CMYK, say) gets a second chance in Pillow."""

    def robust(data: bytes, rng: random.Random, out: np.ndarray) -> None:
        state = rng.getstate()
        try:
            decode(data, rng, out)
        except Exception as first:
            rng.setstate(state)
            try:
                _decode_pillow(data, rng, out)
            except NotJpegError:
                raise
            except Exception:
                raise first from None

    return robust


# --------------------------------------------------------------------------- the source


def _timed_read(path: str) -> bytes:
    """The file's bytes; the read's wall time goes to the `read` stage (storage waits use no CPU)."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)  # a third less CPU than Path.read_bytes' buffered file object
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size)
    finally:
        os.close(fd)
    if len(data) != size:  # a short read (a file that changed, some network filesystems): the ordinary way
        data = Path(path).read_bytes()
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
        return _decode_with_pillow_fallback(decode) if self.fallback else decode

    def describe(self) -> str:
        return f"decode {self.root} -> {self.batch}x{self.image_size}x{self.image_size}x3 uint8 ({self.decoder})"


# --------------------------------------------------------------------------- command line


def check_dataset(root: str, list_file: str | None, workers: int) -> int:
    """List the dataset once up front, so a bad folder is one line and exit code 2, not N worker errors."""
    files, _, _ = list_images(root, list_file)
    if len(files) < workers:
        raise DatasetError(f"{len(files)} images in {root} cannot be shared by {workers} workers")
    return len(files)


def _run(args: argparse.Namespace) -> int:

    try:
        check_dataset(args.data, args.list, args.workers)
        if args.decoder.startswith("roi"):
            library()  # built once here, before the workers start
        if args.cold_cache:
            drop_pages(Path(args.data) / f for f in list_images(args.data, args.list)[0])
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
        print(f"decode: skipped {bad} bad file{'s' if bad != 1 else ''} (not decodable as JPEG)", file=sys.stderr)
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
