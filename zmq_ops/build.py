"""Build the zmq_ops op library against the TensorFlow installed in this environment.

A TensorFlow op library must be compiled with the very TensorFlow that loads
it (same headers, same C++ ABI), so it is built on the user's machine rather
than shipped. Runs as `python zmq_ops/build.py` (what `make op` does) and is
imported by setup.py's build_ext; it never imports the zmq_ops package itself.

The build is incremental: it is skipped when the library is newer than every
source and was built for the installed TensorFlow version (the version is
stamped into the library, so no extra file is needed to remember it).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
LIBRARY = HERE / ("_zmq_ops" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
STAMP_MARK = b"feedbench-zmq-ops-stamp:"
ZMQ_HEADER = Path("/usr/include/zmq.h")
NO_ZMQ = "libzmq headers not found: install them with `sudo apt-get install libzmq3-dev`"


class BuildError(RuntimeError):
    """The library could not be built; the message says what to do about it."""


def library_path() -> Path:
    """Where the built library lives (next to the zmq_ops package)."""
    return LIBRARY


@dataclass(frozen=True)
class NativeLibrary:
    """One TensorFlow op library of this project: its sources, where it goes, what else it links.

    The zmq_ops op is one; the emulated device's op (tf_trainer/models/emulated_op) is built the same way.
    """

    label: str  # in messages: "zmq_ops"
    src: Path  # folder of *.cc / *.h
    library: Path
    stamp_mark: bytes  # precedes the stamp string compiled into the library
    stamp_define: str  # the macro the sources read the stamp from
    extra_flags: Callable[[], tuple[list[str], list[str]]] | None = None  # (compile, link) flags, may raise BuildError
    script: Path = Path(__file__).resolve()  # a change to the build script rebuilds too

    def sources(self) -> list[Path]:
        return sorted([*self.src.glob("*.cc"), *self.src.glob("*.h")])


def _sources() -> list[Path]:
    return ZMQ_OPS.sources()


def _installed_tf_version() -> str | None:
    """TensorFlow's version from package metadata, without importing it (which takes seconds)."""
    for dist in importlib.metadata.packages_distributions().get("tensorflow", []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _stamp(tf_version: str) -> str:
    return f"tf={tf_version}"


def built_stamp(lib: Path = LIBRARY, mark: bytes = STAMP_MARK) -> str | None:
    """The stamp compiled into an existing library, or None."""
    try:
        data = lib.read_bytes()
    except OSError:
        return None
    at = data.find(mark)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    return data[at + len(mark) : end].decode("ascii", "replace")


def up_to_date(tf_version: str | None = None, spec: NativeLibrary | None = None) -> bool:
    """True when the library exists, is newer than the sources and matches the installed TensorFlow."""
    spec = spec or ZMQ_OPS
    tf_version = tf_version or _installed_tf_version()
    if tf_version is None or not spec.library.exists():
        return False
    newest = max(p.stat().st_mtime for p in [*spec.sources(), Path(__file__), spec.script])
    return spec.library.stat().st_mtime >= newest and built_stamp(spec.library, spec.stamp_mark) == _stamp(tf_version)


def _zmq_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags for libzmq, or BuildError with the one line that says how to install it."""
    if ZMQ_HEADER.exists():
        return [], ["-lzmq"]
    if shutil.which("pkg-config"):
        probe = subprocess.run(["pkg-config", "--cflags", "--libs", "libzmq"], capture_output=True, text=True)
        if probe.returncode == 0:
            cflags = subprocess.run(["pkg-config", "--cflags", "libzmq"], capture_output=True, text=True).stdout
            libs = subprocess.run(["pkg-config", "--libs", "libzmq"], capture_output=True, text=True).stdout
            return shlex.split(cflags), shlex.split(libs) or ["-lzmq"]
    raise BuildError(NO_ZMQ)


def _tf_flags() -> tuple[str, list[str], list[str]]:
    """(version, compile flags, link flags) from tf.sysconfig, asked in a child process.

    A child keeps TensorFlow out of the calling process (setup.py, make).
    """
    code = (
        "import json, tensorflow as tf; print(json.dumps([tf.__version__, "
        "tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise BuildError(f"cannot import TensorFlow to get its build flags:\n{proc.stderr.strip()[-2000:]}")
    version, cflags, lflags = json.loads(proc.stdout.strip().splitlines()[-1])
    return version, cflags, lflags


def _compile(cxx: str, flags: list[str], sources: list[Path], objdir: Path, label: str = "zmq_ops") -> list[Path]:
    """Compile the sources in parallel (they are independent); BuildError shows the compiler's output."""
    jobs = []
    for src in sources:
        obj = objdir / (src.stem + ".o")
        cmd = [cxx, *flags, "-c", str(src), "-o", str(obj)]
        jobs.append((src, obj, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    failed = []
    for src, _, proc in jobs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"--- {src.name} ---\n{out.strip()}")
    if failed:
        raise BuildError(f"compiling the {label} op failed:\n" + "\n".join(failed))
    return [obj for _, obj, _ in jobs]


def build_library(spec: NativeLibrary, force: bool = False, verbose: bool = True) -> Path:
    """Build `spec` against the installed TensorFlow if it is missing or stale, and return its path."""
    if not force and up_to_date(spec=spec):
        return spec.library
    extra_cflags, extra_libs = spec.extra_flags() if spec.extra_flags else ([], [])
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise BuildError(f"C++ compiler {cxx!r} not found: install it with `sudo apt-get install g++`")

    # One build at a time (make and pip may race); the lock is on the source folder itself.
    fd = os.open(spec.src, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not force and up_to_date(spec=spec):  # someone else built it while we waited
            return spec.library
        started = time.monotonic()
        tf_version, tf_cflags, tf_lflags = _tf_flags()
        if verbose:
            print(
                f"{spec.label}: building {spec.library.name} for TensorFlow {tf_version} ...",
                file=sys.stderr,
                flush=True,
            )
        flags = [
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-Wall",
            "-Wno-sign-compare",
            *tf_cflags,
            *extra_cflags,
            f'-D{spec.stamp_define}="{_stamp(tf_version)}"',
        ]
        sources = sorted(spec.src.glob("*.cc"))
        with tempfile.TemporaryDirectory(prefix=f"{spec.label}_build_") as tmp:
            objects = _compile(cxx, flags, sources, Path(tmp), spec.label)
            out = Path(tmp) / spec.library.name
            link = [cxx, "-shared", *map(str, objects), "-o", str(out), *tf_lflags, *extra_libs, "-Wl,--no-undefined"]
            proc = subprocess.run(link, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"linking the {spec.label} op failed:\n{proc.stdout}{proc.stderr}".strip())
            # Replace atomically: a process loading the old library never sees half a file.
            staged = spec.library.with_name(f".{spec.library.name}.{os.getpid()}.tmp")
            shutil.copy2(out, staged)
            os.replace(staged, spec.library)
        if verbose:
            print(f"{spec.label}: built {spec.library} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return spec.library
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def build(force: bool = False, verbose: bool = True) -> Path:
    """Build the zmq_ops library if it is missing or stale, and return its path."""
    return build_library(ZMQ_OPS, force, verbose)


ZMQ_OPS = NativeLibrary(
    label="zmq_ops",
    src=SRC,
    library=LIBRARY,
    stamp_mark=STAMP_MARK,
    stamp_define="ZMQ_OPS_BUILD_STAMP",
    extra_flags=lambda: _zmq_flags(),  # looked up at call time (tests replace it)
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the zmq_ops TensorFlow op library.")
    parser.add_argument("--force", action="store_true", help="rebuild even if the library is up to date")
    parser.add_argument("--quiet", action="store_true", help="print nothing unless the build fails")
    args = parser.parse_args(argv)
    try:
        path = build(force=args.force, verbose=not args.quiet)
    except BuildError as e:
        print(f"zmq_ops: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"zmq_ops: {path} is up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
