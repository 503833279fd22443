"""Fuzz the native code under AddressSanitizer and UndefinedBehaviorSanitizer for a fixed budget.

Builds two fuzzers (scripts/fuzz/) with the project's sanitizer flags (core/native_flags.py) from the
very sources the libraries are built from, into build/fuzz-asan/ (rebuilt when a source changes), makes
their seeds (JPEGs of every kind the ROI decoder meets; native, zmq_ops and shm slot messages), and runs:

- roi: the ROI JPEG decoder (roi_decode.c), header, crop decode at every scale and flag, halving;
- wire: the wire decoders (wire_decode.cc, the shm slot-message decoder) and the sequence accounting;
- receiver: the TF-free receiver end to end (receiver.cc, zmq_core.cc) over a real ipc socket, copying
  and zero-copy, with floods of bad messages and a peer that disconnects and comes back;
- shm: the shm:// consumer (shm.cc): real sealed memfd regions, good and flawed, handed over on its
  abstract socket by honest and hostile peers (no descriptor, two, a pipe's, another process's label, a
  peer that closes or never sends, forked producers that exit), then valid and fuzzed slot messages
  resolved into them, each checked to resolve inside its slot to the producer's bytes or be refused;
- shm_receiver: the receiver over a shm:// endpoint end to end (a region handed over, slot messages over
  ZMQ, valid or mutated), each batch it delivers checked to be the region's bytes;
- curve: the receiver as a CURVE server (its ZAP handler and handshake monitor, zmq_core.cc) fed as
  `receiver` is by peers holding the client's keys, a stranger's, the wrong server key, or none.

`make fuzz-asan` runs it (FUZZ_SECONDS per target); prints one line per target with the inputs tried and
fails on any sanitizer report or crash. Needs the C and C++ compilers, libjpeg-turbo and libzmq headers.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from core.native_flags import SANITIZE, WARNINGS  # noqa: E402
from wire import curve, native, shm, zmqops_format  # noqa: E402

HERE = ROOT / "scripts" / "fuzz"
OUT = ROOT / "build" / "fuzz-asan"
ZMQ_SRC = ROOT / "zmq_ops" / "src"
ROI_SRC = ROOT / "core" / "images" / "jpeg_roi" / "roi_decode.c"
TARGETS = {
    "fuzz_roi": (["cc", "-O1"], [HERE / "fuzz_roi.c", ROI_SRC], ["-ljpeg"]),
    "fuzz_wire": (
        ["c++", "-std=c++17", "-O1", "-Wno-sign-compare", f"-I{ZMQ_SRC}", "-pthread"],
        [HERE / "fuzz_wire.cc", *(ZMQ_SRC / n for n in ("wire_decode.cc", "zmq_core.cc", "shm.cc", "receiver.cc"))],
        ["-lzmq", "-lrt"],
    ),
}
SANITIZER_ENV = {
    "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}


def build(name: str) -> Path:
    """The sanitized fuzzer `name`, compiled if any of its sources is newer than it."""
    head, sources, libs = TARGETS[name]
    exe = OUT / name
    inputs = [*sources, *HERE.glob("*.h"), *ZMQ_SRC.glob("*.h"), ROOT / "core" / "native_flags.py"]
    if exe.exists() and exe.stat().st_mtime >= max(p.stat().st_mtime for p in inputs):
        return exe
    OUT.mkdir(parents=True, exist_ok=True)
    cmd = [*head, *WARNINGS, "-Werror", *SANITIZE, "-o", str(exe), *map(str, sources), *libs]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"fuzz-asan: building {name} failed:\n{proc.stderr.strip()[-3000:]}")
    return exe


def jpeg_seeds(folder: Path) -> list[Path]:
    """JPEGs of each kind: baseline 4:2:0 and 4:4:4, progressive colour and grey, CMYK, 1x1, an odd size."""
    rng = np.random.default_rng(0)
    base = np.clip(
        np.add.outer(np.arange(48), np.arange(40))[..., None] * [3, 2, 1] + rng.integers(0, 60, (48, 40, 3)), 0, 255
    )
    img = Image.fromarray(base.astype(np.uint8))
    kinds = {
        "base420": (img, {"subsampling": 2}),
        "base444": (img, {"subsampling": 0, "quality": 95}),
        "prog420": (img, {"progressive": True, "subsampling": 2}),
        "prog444": (img, {"progressive": True, "subsampling": 0}),
        "grey": (img.convert("L"), {"progressive": True}),
        "cmyk": (img.convert("CMYK"), {}),
        "tiny": (img.resize((1, 1)), {}),
        "odd": (img.resize((37, 13)), {"progressive": True}),
    }
    paths = []
    for name, (im, save) in kinds.items():
        buf = io.BytesIO()
        im.save(buf, "JPEG", **save)
        paths.append(folder / f"{name}.jpg")
        paths[-1].write_bytes(buf.getvalue())
    return paths


def frames_file(path: Path, frames: list[bytes]) -> Path:
    """A seed message for fuzz_wire: each frame as a little-endian uint32 length and its bytes."""
    path.write_bytes(b"".join(len(f).to_bytes(4, "little") + bytes(f) for f in frames))
    return path


def wire_seeds(folder: Path) -> list[Path]:
    """Messages the receiver expects (uint8 [2,4,4,3], int32 [2]) in each format, and near misses."""
    good = [np.full((2, 4, 4, 3), 1, np.uint8), np.arange(2, dtype=np.int32)]
    odd = [np.zeros((3,), np.float64), np.zeros((0, 2), np.int64), np.ones((2,), np.bool_)]
    offsets, _ = shm.layout(good)
    seeds = {
        "native": native.encode(good, 1, 0, extras={"sent": 0}),
        "native_odd": native.encode(odd, 2, 7),
        "zmqops": [zmqops_format.dump_arrays(good)],
        "zmqops_odd": [zmqops_format.dump_arrays(odd)],
        "slot": shm.encode(good, 3, 1, f"fb-{os.getpid()}-0001", 1, offsets),
    }
    return [frames_file(folder / f"{name}.msg", [bytes(f) for f in frames]) for name, frames in seeds.items()]


def curve_keys(folder: Path) -> dict[str, str]:
    """The curve target's key folders: the run's (server and client pairs) and a stranger's client pair."""
    keys, stranger = curve.make_keys(folder / "keys"), curve.make_keys(folder / "stranger")
    return {"FB_FUZZ_KEYS": str(keys), "FB_FUZZ_STRANGER": str(stranger)}


def run(exe: Path, args: list[str], timeout: float, env: dict[str, str] | None = None) -> list[dict]:
    """Run one fuzzer; its figures, or SystemExit with the sanitizer's report."""
    env = {**os.environ, **SANITIZER_ENV, **(env or {})}
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"fuzz-asan: {exe.name} failed (exit {proc.returncode}):\n{proc.stderr.strip()[-6000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="budget of each fuzzer, in seconds")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the mutations")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON list")
    args = parser.parse_args(argv)
    roi, wire_fuzzer = build("fuzz_roi"), build("fuzz_wire")
    with tempfile.TemporaryDirectory(prefix="fb-fuzz-", dir="/tmp") as tmp:
        folder = Path(tmp)
        jpegs, messages = jpeg_seeds(folder), wire_seeds(folder)
        limit = 6 * args.seconds + 120  # a fuzzer that hangs fails too
        figures = run(roi, [str(args.seconds), str(args.seed), *map(str, jpegs)], limit)
        wire_args = [str(5 * args.seconds), str(args.seed), tmp, *map(str, messages)]
        figures += run(wire_fuzzer, wire_args, limit, curve_keys(folder))
    if args.json:
        print(json.dumps(figures))
    else:
        for f in figures:
            print(f"fuzz-asan: {f['target']}: {f['inputs']:,} inputs in {args.seconds:g} s, no sanitizer report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
