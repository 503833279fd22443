"""`python -m producers make-dataset`: a small ImageNet-layout folder of real JPEG photographs.

Decoding cost depends on what is decoded: random noise compresses badly and
decodes unlike a photograph, so the decoding benchmarks need real pictures.
The photographs that ship inside scikit-image (no download) are cut, scaled
and flipped at random into JPEGs of ImageNet's typical size (about 500x375,
some portrait) and quality (about 90), one sub-folder per class.

`--like imagenet` follows ImageNet's training set more closely: its spread
of sizes (a long tail up to several thousand pixels, made of tiles of the
photographs so a large file has a photograph's detail per pixel), qualities
and chroma subsampling, and its odd files (grayscale, CMYK, progressive, a
PNG named .JPEG), each at least once; docs/decoding.md gives the figures and
their sources. A MANIFEST.json at the top says what each file is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from core.atomic import not_regular, write_all
from core.cli_types import non_negative_int, positive_int
from core.errors import OutputError

# Photographs bundled with scikit-image itself (available offline); grey ones become RGB.
PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "cat",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "camera",
    "coins",
    "moon",
    "brick",
    "grass",
    "gravel",
    "clock",
)

# ImageNet's common sizes: 500 on the long side, 333..375 on the short one, a few bigger.
LONG_SIDES = (500, 500, 500, 500, 480, 512, 640)
SHORT_RATIOS = (0.75, 0.75, 0.75, 0.666, 0.70, 0.8)
PORTRAIT_SHARE = 0.2


def load_photos() -> list[np.ndarray]:
    """The bundled photographs as RGB uint8 arrays (skipping any this install lacks)."""
    import skimage.data

    photos = []
    for name in PHOTOS:
        try:
            img = np.asarray(getattr(skimage.data, name)())
        except Exception:  # an optional data file not in this install: use the others
            continue
        if img.ndim == 2:
            img = np.stack([img] * 3, axis=-1)
        photos.append(np.ascontiguousarray(img[..., :3].astype(np.uint8)))
    if not photos:
        raise RuntimeError("no scikit-image sample photographs could be loaded")
    return photos


def random_view(photo: np.ndarray, rng: np.random.Generator) -> Image.Image:
    """A random crop of `photo`, scaled to an ImageNet-like size, maybe mirrored and re-lit."""
    long_side = int(rng.choice(LONG_SIDES)) + int(rng.integers(-12, 13))
    short_side = int(round(long_side * float(rng.choice(SHORT_RATIOS)))) + int(rng.integers(-8, 9))
    w, h = (short_side, long_side) if rng.random() < PORTRAIT_SHARE else (long_side, short_side)
    ph, pw = photo.shape[:2]
    # The largest crop of the target's aspect ratio, then 45-100% of it, anywhere in the photo.
    aspect = w / h
    cw, ch = (pw, round(pw / aspect)) if pw / ph < aspect else (round(ph * aspect), ph)
    f = float(rng.uniform(0.45, 1.0))
    cw, ch = max(16, int(cw * f)), max(16, int(ch * f))
    x, y = int(rng.integers(0, pw - cw + 1)), int(rng.integers(0, ph - ch + 1))
    img = Image.fromarray(photo[y : y + ch, x : x + cw]).resize((w, h), Image.Resampling.LANCZOS)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    gain = float(rng.uniform(0.85, 1.15))
    if abs(gain - 1) > 0.02:
        img = img.point(lambda v: min(255, int(v * gain)))
    return img


def make_dataset(root: str | Path, classes: int, per_class: int, seed: int = 0, quality: int = 90) -> list[Path]:
    """Write `classes` folders (n00000000, n00000001, ...) of `per_class` JPEGs each; returns the files."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    photos = load_photos()
    written = []
    for c in range(classes):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            img = random_view(photos[int(rng.integers(len(photos)))], rng)
            path = folder / f"n{c:08d}_{k}.JPEG"
            img.save(path, "JPEG", quality=int(quality + rng.integers(-2, 3)))
            written.append(path)
    return written


# --like imagenet: (share, long side low, high) of the size classes; the short side mostly 2/3-4/5 of the long.
IMAGENET_SIZES = ((0.2, 120, 470), (0.645, 480, 520), (0.15, 520, 1000), (0.005, 1200, 4000))
# (share, quality low, high) of the JPEG qualities.
IMAGENET_QUALITIES = ((0.6, 90, 97), (0.3, 75, 89), (0.1, 50, 74))
# Odd files: share of the set, and the least number in any set of 20 files or more.
IMAGENET_ODD = {"grayscale": 0.02, "progressive": 0.03, "cmyk": 0.005, "png": 0.002}
SHARE_444 = 0.1  # files without chroma subsampling
TILE = (500, 375)


def _pick(rng: np.random.Generator, table: tuple[tuple[float, int, int], ...]) -> int:
    """An integer from the (share, low, high) row drawn by share."""
    row = table[int(rng.choice(len(table), p=[r[0] for r in table]))]
    return int(rng.integers(row[1], row[2] + 1))


def _canvas(photos: list[np.ndarray], w: int, h: int, rng: np.random.Generator) -> Image.Image:
    """A w x h picture: one view of a photograph, or, when large, a mosaic of ImageNet-sized views."""
    if w <= 2 * TILE[0] and h <= 2 * TILE[1]:
        view = random_view(photos[int(rng.integers(len(photos)))], rng)
        return view.resize((w, h), Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", (w, h))
    for y in range(0, h, TILE[1]):
        for x in range(0, w, TILE[0]):
            view = random_view(photos[int(rng.integers(len(photos)))], rng).resize(TILE)
            canvas.paste(view, (x, y))
    return canvas


def _odd_kinds(n: int, rng: np.random.Generator) -> list[str]:
    """The kind of each of n files: 'plain' or an odd kind, each odd kind present at least once if n >= 20."""
    kinds = ["plain"] * n
    at = iter(rng.permutation(n).tolist())
    for kind, share in IMAGENET_ODD.items():
        for _ in range(max(1 if n >= 20 else 0, round(share * n))):
            kinds[next(at)] = kind
    return kinds


def _save_like_imagenet(img: Image.Image, path: Path, kind: str, quality: int, rng: np.random.Generator) -> None:
    if kind == "png":
        img.save(path, "PNG")  # named .JPEG, as one ImageNet file is
        return
    subsampling = 0 if rng.random() < SHARE_444 else 2  # 4:4:4 or 4:2:0
    mode = {"grayscale": "L", "cmyk": "CMYK"}.get(kind, "RGB")
    img.convert(mode).save(path, "JPEG", quality=quality, subsampling=subsampling, progressive=kind == "progressive")


def make_imagenet_like(root: str | Path, classes: int, per_class: int, seed: int = 0) -> list[Path]:
    """Write an ImageNet-like set (sizes, qualities, odd files) and its MANIFEST.json; returns the files."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    photos = load_photos()
    kinds = iter(_odd_kinds(classes * per_class, rng))
    written, manifest = [], {}
    for c in range(classes):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            long_side = _pick(rng, IMAGENET_SIZES)
            ratio = float(rng.choice(SHORT_RATIOS)) if rng.random() < 0.8 else float(rng.uniform(0.5, 1.0))
            short_side = max(16, round(long_side * ratio))
            w, h = (short_side, long_side) if rng.random() < PORTRAIT_SHARE else (long_side, short_side)
            kind, quality = next(kinds), _pick(rng, IMAGENET_QUALITIES)
            path = folder / f"n{c:08d}_{k}.JPEG"
            _save_like_imagenet(_canvas(photos, w, h, rng), path, kind, quality, rng)
            manifest[f"{folder.name}/{path.name}"] = {"kind": kind, "width": w, "height": h, "quality": quality}
            written.append(path)
    write_all({str(root / MANIFEST): json.dumps(manifest, indent=1) + "\n"})  # beside it, then renamed
    return written


MANIFEST = "MANIFEST.json"


def check_target(folder: str) -> None:
    """Refuse, before any file is written, a MANIFEST.json there that is not a regular file: a pipe would hang
    the write, a symlink would send it elsewhere."""
    what = not_regular(os.path.join(folder, MANIFEST))
    if what is not None:
        raise OutputError(f"{os.path.join(folder, MANIFEST)} is {what}, not a file: move it away (nothing written)")


def _run(args: argparse.Namespace) -> int:
    try:
        if args.like == "imagenet":
            check_target(args.folder)
            files = make_imagenet_like(args.folder, args.classes, args.per_class, args.seed)
        else:
            files = make_dataset(args.folder, args.classes, args.per_class, args.seed, args.quality)
    except (OSError, RuntimeError, OutputError) as e:
        print(f"error: cannot make a dataset in {args.folder}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(files)} JPEGs in {args.classes} class folders under {args.folder}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-dataset", help="write an ImageNet-layout folder of JPEG photographs")
    p.add_argument("folder", help="where to write the class sub-folders")
    p.add_argument("--classes", type=positive_int, default=10, help="class sub-folders")
    p.add_argument("--per-class", type=positive_int, default=50, help="JPEGs per class")
    p.add_argument(
        "--seed", type=non_negative_int, default=0, help="seed of the photographs' crops and the JPEG quality jitter"
    )
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (each file varies by up to 2)")
    p.add_argument(
        "--like",
        choices=("imagenet",),
        help="follow ImageNet's training set: its sizes, qualities and odd files (docs/decoding.md)",
    )
    p.set_defaults(func=_run)
