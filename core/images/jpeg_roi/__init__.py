"""Region-of-interest JPEG decoding on libjpeg-turbo: decode only the rows and columns a crop keeps.

`RoiDecoder.header` reads a file's header; the caller draws its crop from the
size; `RoiDecoder.decode` decodes just that crop (optionally DCT-scaled by
1/2, 1/4 or 1/8) into a reused buffer and returns it as a numpy view; a
progressive file's scans are entropy-decoded only down to the crop (and at
1/8 scale only its DC scans), with the same pixels. `halve` is the
antialiasing step of a resize that shrinks an axis 2x or more. The C
side (`roi_decode.c`, built by `build.py`, on first use if need be) is called
through ctypes, which releases the GIL for each call, so decoding threads run
in parallel. Memory is bounded: libjpeg may take at most `max_memory()` bytes
(a progressive file holds all its coefficients) and the crop buffer at most
`MAX_CROP_PIXELS` pixels; a file beyond either is refused with the reason.
"""

from __future__ import annotations

import ctypes
import threading
from typing import NamedTuple

import numpy as np

# A crop decoded at its scale may have at most this many pixels (3 bytes each): 96 MiB.
MAX_CROP_PIXELS = 32 << 20
# jpeg_crop_scanline widens the columns to whole iMCUs: at most 32 pixels at full scale.
_WIDEN = 32
# J_COLOR_SPACE values of jpeglib.h.
COLOUR_SPACES = {0: "unknown", 1: "grayscale", 2: "RGB", 3: "YCbCr", 4: "CMYK", 5: "YCCK"}

# roi_decode's flags (roi_decode.c).
_FAST, _DC_SCANS, _SKIP_BELOW = 1, 2, 4

_LIB: ctypes.CDLL | None = None
_LOCK = threading.Lock()
_LOCAL = threading.local()


class RoiDecodeError(ValueError):
    """A file the ROI decoder cannot or will not decode; the message says why."""


class JpegHeader(NamedTuple):
    """What a JPEG's header says: size, colour space, whether it is progressive (a tuple: made per file)."""

    width: int
    height: int
    colour_space: str
    progressive: bool
    components: int


def library() -> ctypes.CDLL:
    """The decoder library, built on first use if it is missing or stale."""
    global _LIB
    with _LOCK:
        if _LIB is None:
            from core.images.jpeg_roi.build import build

            lib = ctypes.CDLL(str(build(verbose=False)))
            p, i, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_double
            lib.roi_new.restype = p
            lib.roi_free.argtypes = [p]
            lib.roi_message.restype = ctypes.c_char_p
            lib.roi_message.argtypes = [p]
            lib.roi_max_memory.restype = ctypes.c_long
            lib.roi_header.restype = i
            lib.roi_header.argtypes = [p, ctypes.c_char_p, ctypes.c_ulong, ctypes.POINTER(i)]
            lib.roi_decode.restype = i
            lib.roi_decode.argtypes = [p, i, i, i, i, i, p, ctypes.c_long, ctypes.c_long, i,
                                       ctypes.POINTER(i), ctypes.POINTER(d)]  # fmt: skip
            lib.roi_skipped_rows.restype = ctypes.c_long
            lib.roi_skipped_rows.argtypes = [p]
            lib.roi_halve.restype = None
            lib.roi_halve.argtypes = [p, ctypes.c_long, i, i, i, i, p, ctypes.c_long]
            _LIB = lib
    return _LIB


def max_memory() -> int:
    """The most memory libjpeg may allocate for one file, in bytes."""
    return int(library().roi_max_memory())


class RoiDecoder:
    """One decoding context (use one per thread: `for_thread()`); keeps its buffer between files."""

    def __init__(self) -> None:
        self._lib = library()
        self._ctx = self._lib.roi_new()
        if not self._ctx:
            raise MemoryError("cannot create a JPEG decoding context")
        self._info = (ctypes.c_int * 5)()
        self._got = (ctypes.c_int * 2)()
        self._times = (ctypes.c_double * 3)()
        self._buffer = np.empty(0, np.uint8)
        self._data: bytes = b""
        self.times = (0.0, 0.0, 0.0)  # last decode: start (setup; a progressive file's entropy decode), skip, rows

    def __del__(self) -> None:
        if getattr(self, "_ctx", None):
            self._lib.roi_free(self._ctx)
            self._ctx = None

    @property
    def skipped_rows(self) -> int:
        """iMCU rows of progressive scans this decoder has left undecoded below its crops so far."""
        return int(self._lib.roi_skipped_rows(self._ctx))

    @classmethod
    def for_thread(cls) -> RoiDecoder:
        """This thread's decoder (a context is not safe to share between threads)."""
        dec = getattr(_LOCAL, "decoder", None)
        if dec is None:
            dec = _LOCAL.decoder = cls()
        return dec

    def _error(self) -> RoiDecodeError:
        return RoiDecodeError(self._lib.roi_message(self._ctx).decode("utf-8", "replace"))

    def header(self, data: bytes) -> JpegHeader:
        """Read the header of `data` (kept for the following `decode`); RoiDecodeError if it is no JPEG."""
        self._data = data  # the library reads from these bytes until the decode ends
        if self._lib.roi_header(self._ctx, data, len(data), self._info) != 0:
            raise self._error()
        w, h, cs, prog, comps = self._info
        return JpegHeader(w, h, COLOUR_SPACES.get(cs, str(cs)), bool(prog), comps)

    def decode(
        self, denom: int, rows: tuple[int, int], cols: tuple[int, int], fast: bool = True, shortcuts: bool = True
    ) -> np.ndarray:
        """Rows and columns [start, stop) of the image scaled by 1/denom, as an RGB view of a reused buffer.

        Call right after `header`. The view is valid until the next decode. `fast`: fast integer IDCT and
        merged chroma upsampling. `shortcuts`: a progressive file is entropy-decoded only down to the crop's
        last rows in each scan, and at 1/8 scale from its DC scans alone (the same pixels; False decodes all
        of it, for comparison).
        """
        (y0, y1), (x0, x1) = rows, cols
        stride = (x1 - x0 + _WIDEN) * 3
        if (y1 - y0) * (x1 - x0 + _WIDEN) > MAX_CROP_PIXELS:
            raise RoiDecodeError(
                f"crop of {x1 - x0}x{y1 - y0} pixels at 1/{denom} scale is over the {MAX_CROP_PIXELS >> 20} Mpixel bound"
            )
        need = (y1 - y0) * stride
        if self._buffer.size < need:
            self._buffer = np.empty(need, np.uint8)
        rc = self._lib.roi_decode(self._ctx, denom, y0, y1, x0, x1, self._buffer.ctypes.data, stride,
                                  self._buffer.size, _FAST * fast | (_DC_SCANS | _SKIP_BELOW) * shortcuts, self._got, self._times)  # fmt: skip
        self._data = b""
        if rc != 0:
            raise self._error()
        self.times = tuple(self._times)
        xoff, width = self._got
        img = self._buffer[:need].reshape(y1 - y0, x1 - x0 + _WIDEN, 3)
        return img[:, x0 - xoff : x0 - xoff + (x1 - x0)]


def halve(img: np.ndarray, fy: int, fx: int) -> np.ndarray:
    """`img` (RGB uint8, rows may be strided) averaged over its 2x1 (fy=2), 1x2 (fx=2) or 2x2 blocks.

    The antialiasing step before a bilinear resize that shrinks an axis 2x or more: a fraction of the cost
    of OpenCV's INTER_AREA, which has no fast path for such shapes.
    """
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8 or img.strides[1:] != (3, 1):
        raise ValueError(f"halve needs an RGB uint8 image with contiguous rows, not {img.dtype} {img.shape}")
    if fy not in (1, 2) or fx not in (1, 2):
        raise ValueError(f"halve halves an axis or leaves it: fy={fy}, fx={fx}")
    rows, cols = img.shape[:2]
    out = np.empty((-(-rows // fy), -(-cols // fx), 3), np.uint8)
    library().roi_halve(img.ctypes.data, img.strides[0], rows, cols, fy, fx, out.ctypes.data, out.strides[0])
    return out
