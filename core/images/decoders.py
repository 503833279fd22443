"""The JPEG decoding stacks: each decodes a file's bytes into a random-resized, randomly flipped crop.

The decode producer runs them in its worker processes and the spdl path in
the trainer's ranks, so one stack gives the same images wherever it runs.
The default is the ROI decoder (`jpeg_roi/`, C on libjpeg-turbo), which
decodes only the crop; docs/decoding.md compares the stacks.
"""

from __future__ import annotations

import io
import math
import random
import time
from collections.abc import Callable

import cv2
import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from core.images.jpeg_roi import RoiDecoder, halve

cv2.setNumThreads(1)  # one worker is one core; parallelism comes from worker processes


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


def with_pillow_fallback(
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
