"""Build the zmq_ops op library (against the installed TensorFlow) and the TF-free receiver.

A TensorFlow op library must be compiled with the very TensorFlow that loads
it (same headers, same C++ ABI), so it is built on the user's machine rather
than shipped. Runs as `python zmq_ops/build.py` (what `make op` does) and is
imported by setup.py's build_ext; it never imports the zmq_ops package itself.

The build is incremental: it is skipped when the library is newer than every
source and was built for the installed TensorFlow version (the version is
stamped into the library, so no extra file is needed to remember it).

`--receiver` builds the receiver library instead (zmq_ops/receiver.py loads
it with ctypes): the same receive core without TensorFlow, for PyTorch and
anything else. It links the system libzmq when its headers are installed,
else the libzmq that the pyzmq wheel bundles (with a small copy of the
declarations it needs, src/compat/zmq.h), so it builds where only pyzmq is.
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
if str(HERE.parent) not in sys.path:  # run as a script (`python zmq_ops/build.py`) or loaded by its path
    sys.path.insert(0, str(HERE.parent))
from core.native_flags import compile_flags, link_flags  # noqa: E402  (after the path is set)

FLAGS_FILE = HERE.parent / "core" / "native_flags.py"  # a change to the flags rebuilds too

SRC = HERE / "src"
LIBRARY = HERE / ("_zmq_ops" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
RECEIVER = HERE / "libfeedbench_receiver.so"
CORE_SOURCES = ("wire_decode.cc", "zmq_core.cc", "shm.cc")
OP_SOURCES = (*CORE_SOURCES, "zmq_connection.cc", "zmq_ops.cc")
RECEIVER_SOURCES = (*CORE_SOURCES, "receiver.cc")
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

    The zmq_ops op is one; the emulated device's op (models/tf/emulated_op) is built the same way.
    """

    label: str  # in messages: "zmq_ops"
    src: Path  # folder of *.cc / *.h
    library: Path
    stamp_mark: bytes  # precedes the stamp string compiled into the library
    stamp_define: str  # the macro the sources read the stamp from
    extra_flags: Callable[[], tuple[list[str], list[str]]] | None = None  # (compile, link) flags, may raise BuildError
    script: Path = Path(__file__).resolve()  # a change to the build script rebuilds too
    cc_names: tuple[str, ...] | None = None  # the .cc files it is made of (default: every one in src)

    def cc_sources(self) -> list[Path]:
        if self.cc_names is None:
            return sorted(self.src.glob("*.cc"))
        return sorted(self.src / n for n in self.cc_names if (self.src / n).exists())

    def sources(self) -> list[Path]:
        return sorted([*self.cc_sources(), *self.src.glob("*.h")])


def _sources(names: tuple[str, ...] = OP_SOURCES) -> list[Path]:
    return sorted([*(SRC / n for n in names if (SRC / n).exists()), *SRC.glob("*.h")])


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
    newest = max(p.stat().st_mtime for p in [*spec.sources(), Path(__file__), spec.script, FLAGS_FILE])
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
    # TensorFlow's headers as system headers: -Wall -Wextra speak of this project's code, not of theirs
    cflags = ["-isystem" + f[2:] if f.startswith("-I") else f for f in cflags]
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
            *compile_flags(),
            "-Wno-sign-compare",
            *tf_cflags,
            *extra_cflags,
            f'-D{spec.stamp_define}="{_stamp(tf_version)}"',
        ]
        sources = spec.cc_sources()
        with tempfile.TemporaryDirectory(prefix=f"{spec.label}_build_") as tmp:
            objects = _compile(cxx, flags, sources, Path(tmp), spec.label)
            out = Path(tmp) / spec.library.name
            link = [cxx, "-shared", *map(str, objects), "-o", str(out), *tf_lflags, *extra_libs, *link_flags(),
                    "-Wl,--no-undefined"]  # fmt: skip
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
    cc_names=OP_SOURCES,  # the receiver's sources share the folder but not the TensorFlow library
)


def _bundled_zmq() -> tuple[list[str], list[str]]:
    """Flags to build against the libzmq in the pyzmq wheel (pyzmq.libs/libzmq-*.so*)."""
    import importlib.util

    spec = importlib.util.find_spec("zmq")
    if spec is None or spec.origin is None:
        raise BuildError("neither libzmq headers nor pyzmq found: `pip install pyzmq` or `apt-get install libzmq3-dev`")
    libs = sorted((Path(spec.origin).parent.parent / "pyzmq.libs").glob("libzmq*.so*"))
    if not libs:
        raise BuildError(f"pyzmq at {Path(spec.origin).parent} bundles no libzmq; install libzmq3-dev instead")
    return [f"-I{SRC / 'compat'}"], [str(libs[0]), f"-Wl,-rpath,{libs[0].parent}"]


def receiver_up_to_date() -> bool:
    if not RECEIVER.exists():
        return False
    newest = max(p.stat().st_mtime for p in [*_sources(RECEIVER_SOURCES), Path(__file__), FLAGS_FILE])
    return RECEIVER.stat().st_mtime >= newest


def build_receiver(force: bool = False, verbose: bool = True) -> Path:
    """Build the TF-free receiver library if it is missing or stale, and return its path."""
    if not force and receiver_up_to_date():
        return RECEIVER
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise BuildError(f"C++ compiler {cxx!r} not found: install it with `sudo apt-get install g++`")
    zmq_cflags, zmq_libs = _zmq_flags() if ZMQ_HEADER.exists() else _bundled_zmq()
    fd = os.open(SRC, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not force and receiver_up_to_date():
            return RECEIVER
        flags = ["-std=c++17", "-O2", "-fPIC", *compile_flags(), "-Wno-sign-compare", "-pthread", *zmq_cflags]
        sources = [SRC / n for n in RECEIVER_SOURCES if (SRC / n).exists()]
        with tempfile.TemporaryDirectory(prefix="fb_receiver_build_") as tmp:
            objects = _compile(cxx, flags, sources, Path(tmp), "receiver")
            out = Path(tmp) / RECEIVER.name
            link = [cxx, "-shared", "-pthread", *map(str, objects), "-o", str(out), *zmq_libs, "-lrt", *link_flags(),
                    "-Wl,--no-undefined"]  # fmt: skip
            proc = subprocess.run(link, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"linking the receiver failed:\n{proc.stdout}{proc.stderr}".strip())
            staged = RECEIVER.with_name(f".{RECEIVER.name}.{os.getpid()}.tmp")
            shutil.copy2(out, staged)
            os.replace(staged, RECEIVER)
        if verbose:
            print(f"zmq_ops: built {RECEIVER}", file=sys.stderr)
        return RECEIVER
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the zmq_ops TensorFlow op library (or the receiver).")
    parser.add_argument("--force", action="store_true", help="rebuild even if the library is up to date")
    parser.add_argument("--quiet", action="store_true", help="print nothing unless the build fails")
    parser.add_argument(
        "--receiver", action="store_true", help="build the TF-free receiver library (no TensorFlow needed)"
    )
    args = parser.parse_args(argv)
    try:
        if args.receiver:
            path = build_receiver(force=args.force, verbose=not args.quiet)
        else:
            path = build(force=args.force, verbose=not args.quiet)
    except BuildError as e:
        print(f"zmq_ops: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"zmq_ops: {path} is up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
