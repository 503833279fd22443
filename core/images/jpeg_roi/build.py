"""Build the ROI JPEG decoder library (`roi_decode.c`) against the system libjpeg-turbo.

Runs as `python core/images/jpeg_roi/build.py` (what `make op` does); the
decoder also builds it on first use. The build is skipped while the library
is newer than its source and this script, runs under a file lock (several
workers may start at once) and puts the library in place with one rename, so
running it twice, or twice at once, is safe.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
if str(ROOT) not in sys.path:  # run as a script: `python core/images/jpeg_roi/build.py`
    sys.path.insert(0, str(ROOT))
from core.native_flags import compile_flags, link_flags  # noqa: E402  (after the path is set)

SOURCE = HERE / "roi_decode.c"
LIBRARY = HERE / "libfeedbench_jpeg_roi.so"
HEADER = Path("/usr/include/jpeglib.h")
NO_HEADERS = "libjpeg-turbo headers not found: install them with `sudo apt-get install libjpeg62-turbo-dev`"


class BuildError(RuntimeError):
    """The library could not be built; the message says what to do about it."""


def up_to_date() -> bool:
    """Whether the built library is newer than its source and this script."""
    if not LIBRARY.exists():
        return False
    flags = ROOT / "core" / "native_flags.py"
    return LIBRARY.stat().st_mtime >= max(SOURCE.stat().st_mtime, Path(__file__).stat().st_mtime, flags.stat().st_mtime)


def build(force: bool = False, verbose: bool = True) -> Path:
    """Build the library if it is missing or stale, and return its path."""
    if not force and up_to_date():
        return LIBRARY
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise BuildError("no C compiler found: install one with `sudo apt-get install gcc`")
    if not HEADER.exists() and not os.environ.get("CPATH"):
        raise BuildError(NO_HEADERS)
    fd = os.open(HERE, os.O_RDONLY)  # the lock is the source folder itself: nothing is left behind
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # workers starting at once: one builds, the others wait and reuse it
        if not force and up_to_date():
            return LIBRARY
        staged = LIBRARY.with_name(f".{LIBRARY.name}.{os.getpid()}.tmp")
        cmd = [cc, "-O2", *compile_flags(), "-Werror", "-fPIC", "-shared", "-o", str(staged), str(SOURCE), "-ljpeg",
               *link_flags(), "-Wl,--no-undefined"]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            staged.unlink(missing_ok=True)
            raise BuildError(f"building {SOURCE.name} failed:\n{proc.stdout}{proc.stderr}".strip())
        os.replace(staged, LIBRARY)  # a reader sees the old library or the new one, never half of one
    finally:
        os.close(fd)
    if verbose:
        print(f"jpeg_roi: built {LIBRARY}", file=sys.stderr)
    return LIBRARY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the ROI JPEG decoder library.")
    parser.add_argument("--force", action="store_true", help="rebuild even if the library is up to date")
    args = parser.parse_args(argv)
    try:
        build(force=args.force)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
