"""Fuzz the zmq_ops pull op with random and mutated messages over a real socket.

The op runs in a worker process (graph mode) that pulls one message per
request; this process makes the messages, sends them, and checks every
answer against the Python reference decoder in wire/. A worker that dies or
stops answering counts as a crash (its message is printed) and is restarted.

    python scripts/fuzz_zmq_op.py --count 100000 [--seed S] [--json]

Every message must either decode to exactly the tensors the Python decoder
gives, or fail with InvalidArgument naming the field the Python decoder
names; at the end a good message must still arrive.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wire import message as wire_message  # noqa: E402
from wire import strings  # noqa: E402
from wire.dtypes import CODE_TO_DTYPE, DTYPE_TO_CODE  # noqa: E402
from wire.errors import WireError  # noqa: E402
from wire.zmqops_format import dump_arrays  # noqa: E402

FIELD = re.compile(r"n_tensors|tensor\[\d+\]\.(?:dtype|ndim|shape(?:\[\d+\])?|nbytes|data|lengths)|message\b|header|magic|"
                   r"version|frames|extras_len|extras")  # fmt: skip
ANSWER_TIMEOUT_S = 20.0
NATIVE = b"FBWN"

# ---------------------------------------------------------------- the worker (runs the op)


def worker(endpoint: str, control: str) -> None:
    """Pull one message per request from `control`, answer with what the op made of it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import zmq_ops

    ctx = zmq.Context()
    ctl = ctx.socket(zmq.REP)
    ctl.connect(control)
    graph = tf.Graph()
    with graph.as_default():
        sock = zmq_ops.ZMQPullSocket(endpoint, [tf.uint8], timeout_ms=int(ANSWER_TIMEOUT_S * 500))
    pulls: dict[tuple[int, ...], object] = {}
    with tf.compat.v1.Session(graph=graph) as sess:
        while True:
            codes = tuple(msgpack.unpackb(ctl.recv()))
            if codes == (-1,):
                ctl.send(b"bye")
                return
            if codes not in pulls:  # pull ops of every signature share the one socket
                with graph.as_default():
                    pulls[codes] = zmq_ops.zmq_pull(sock.handle, [tf.as_dtype(c) for c in codes])
            ctl.send(b"go")  # the sender may now send the message
            ctl.recv()
            try:
                out = sess.run(pulls[codes])
                answer = {"ok": True, "tensors": [_digest(np.asarray(t)) for t in (out or [])]}
            except tf.errors.OpError as e:
                answer = {"ok": False, "kind": type(e).__name__, "error": e.message.replace(endpoint, "EP")}
            ctl.send(msgpack.packb(answer))


def _digest(a: np.ndarray) -> list:
    if a.dtype == strings.DTYPE:  # byte strings (tf.string): each one's length and bytes
        data = b"".join(len(b).to_bytes(8, "little") + bytes(b) for b in a.reshape(-1))
        return ["bytes", list(a.shape), hashlib.sha1(data).hexdigest()]
    data = (a.view(np.uint8) != 0).tobytes() if a.dtype == np.bool_ else a.tobytes()
    return [a.dtype.str, list(a.shape), hashlib.sha1(data).hexdigest()]


# ---------------------------------------------------------------- message generation


def real_batches(rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Small batches shaped like the real thing, in every wire dtype."""
    out = [
        [rng.integers(0, 256, (4, 8, 8, 3), dtype=np.uint8), rng.integers(0, 1000, (4,), dtype=np.int32)],
        [rng.standard_normal((2, 3, 5)).astype(np.float32), np.arange(2, dtype=np.int64)],
        [np.zeros((0, 7), np.float16), np.array(3.5, np.float64), np.array([True, False])],
    ]
    out.append([(np.arange(3) % 2).astype(dt) for dt in DTYPE_TO_CODE])
    files = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 40, 5)]
    out.append([strings.of(files), rng.integers(0, 1000, (5,), dtype=np.int32)])  # a batch of JPEG files' bytes
    return out


def code(dtype: np.dtype | str) -> int:
    """The wire code of a numpy dtype, or of a vector's "bytes"."""
    return strings.CODE if dtype in ("bytes", strings.DTYPE) else DTYPE_TO_CODE[np.dtype(dtype)]


def bases(rng: np.random.Generator) -> list[tuple[list[bytes], tuple[int, ...]]]:
    """Valid and invalid messages to mutate, each with the dtype codes a consumer would declare."""
    vectors = json.loads((ROOT / "wire" / "vectors.json").read_text())
    out = []
    for v in vectors["valid"]:
        codes = tuple(code(t["dtype"]) for t in v["tensors"])
        out.append(([bytes.fromhex(f) for f in v["frames"]], codes))
    for v in vectors["invalid"]:
        out.append(([bytes.fromhex(f) for f in v["frames"]], (4,)))
    from wire import native

    for arrays in real_batches(rng):
        codes = tuple(code(a.dtype) for a in arrays)
        if strings.CODE not in codes:  # the zmq_ops format has no byte strings
            out.append(([dump_arrays(arrays)], codes))
        frames = native.encode(arrays, producer_id=3, seq=9, extras={"k": 1})
        out.append(([bytes(f) if isinstance(f, bytes) else f.tobytes() for f in frames], codes))
    return out


INTERESTING = [0, 1, 2, 3, 8, 9, 24, 127, 255, 1024, 1025, 65535, 2**31 - 1, -1, -2, -(2**31), 2**32 - 1]


def mutate(frames: list[bytes], rnd: random.Random) -> list[bytes]:
    """One to three random mutations: byte flips, integer smashes, truncation, extension, frame edits."""
    frames = list(frames)
    for _ in range(rnd.randint(1, 3)):
        op = rnd.randrange(10)
        i = rnd.randrange(len(frames))
        f = bytearray(frames[i])
        if op == 0 and f:  # flip bits
            for _ in range(rnd.randint(1, 8)):
                f[rnd.randrange(len(f))] ^= 1 << rnd.randrange(8)
        elif op == 1 and len(f) >= 4:  # smash an aligned int32 with a boundary value
            at = rnd.randrange(len(f) // 4) * 4
            f[at : at + 4] = struct.pack("<I", rnd.choice(INTERESTING) & 0xFFFFFFFF)
        elif op == 2 and len(f) >= 8:  # smash an int64
            at = rnd.randrange(len(f) - 7)
            v = rnd.choice([*INTERESTING, 2**62, 2**63 - 1, -(2**63), 2**40])
            f[at : at + 8] = struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)
        elif op == 3:  # truncate
            del f[rnd.randrange(len(f) + 1) :]
        elif op == 4:  # extend
            f += rnd.randbytes(rnd.choice([1, 3, 8, 64]))
        elif op == 5 and len(frames) > 1:  # drop a frame
            del frames[i]
            continue
        elif op == 6:  # duplicate a frame
            frames.insert(i, bytes(f))
        elif op == 7:  # a random frame somewhere
            frames.insert(rnd.randrange(len(frames) + 1), rnd.randbytes(rnd.randrange(0, 64)))
        elif op == 8:  # make it look native, or not
            f[:4] = NATIVE if f[:4] != NATIVE else b"XXXX"
        else:  # set a single byte
            if f:
                f[rnd.randrange(len(f))] = rnd.randrange(256)
        frames[i] = bytes(f)
    return frames or [b""]


def random_message(rnd: random.Random) -> list[bytes]:
    """Frames of pure noise, sometimes behind a plausible native or zmq_ops prefix."""
    n = rnd.choice([1, 1, 1, 2, 3, rnd.randint(1, 40)])
    frames = [rnd.randbytes(rnd.randrange(0, 96)) for _ in range(n)]
    start = rnd.randrange(4)
    if start == 0:
        frames[0] = NATIVE + struct.pack("<HH", 1, rnd.randrange(4)) + frames[0]
    elif start == 1:
        frames[0] = struct.pack("<i", rnd.randrange(4)) + frames[0]
    return frames


def many_frames(rnd: random.Random) -> list[bytes]:
    """More frames than any valid message can have (the op keeps only the first ones)."""
    return [b"FBWN" + bytes(28)] + [b"x"] * rnd.choice([1030, 1500, 3000])


# ---------------------------------------------------------------- the reference answer


def expected(frames: list[bytes], codes: tuple[int, ...]) -> dict:
    """What the op must answer, from the Python decoder and the declared dtypes."""
    try:
        batch = wire_message.decode_message(frames)
    except WireError as e:
        return {"ok": False, "field": e.field}
    except Exception as e:  # a bug in the reference decoder itself: reported, not fatal
        return {"ok": None, "python_error": f"{type(e).__name__}: {e}"}
    arrays = batch.arrays
    if len(arrays) != len(codes):
        return {"ok": False, "field": "n_tensors"}
    for i, (a, c) in enumerate(zip(arrays, codes, strict=True)):
        if a.dtype != (strings.DTYPE if c == strings.CODE else CODE_TO_DTYPE[c]):
            return {"ok": False, "field": f"tensor[{i}].dtype"}
    return {"ok": True, "tensors": [_digest(a.copy()) for a in arrays]}


# ---------------------------------------------------------------- the driver


@dataclass
class Report:
    sent: int = 0
    accepted: int = 0
    rejected: int = 0
    crashes: int = 0
    other_errors: int = 0
    mismatches: int = 0
    reference_errors: int = 0  # messages the Python decoder raised on (not WireError)
    fields: collections.Counter = field(default_factory=collections.Counter)
    examples: list = field(default_factory=list)
    final_ok: bool = False
    seconds: float = 0.0

    def note(self, kind: str, frames: list[bytes], detail: object) -> None:
        if len(self.examples) < 10:
            self.examples.append({"kind": kind, "frames": [f[:80].hex() for f in frames[:6]], "detail": detail})


class Worker:
    def __init__(self, folder: str, n: int) -> None:
        self.endpoint = f"ipc://{folder}/data{n}"
        control = f"ipc://{folder}/ctl{n}"
        self.ctx = zmq.Context()
        self.ctl = self.ctx.socket(zmq.REQ)
        self.ctl.setsockopt(zmq.LINGER, 0)
        self.ctl.setsockopt(zmq.RCVTIMEO, int(ANSWER_TIMEOUT_S * 1000))
        self.ctl.bind(control)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", self.endpoint, control],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.data = self.ctx.socket(zmq.PUSH)
        self.data.setsockopt(zmq.LINGER, 0)
        self.data.connect(self.endpoint)

    def ask(self, frames: list[bytes], codes: tuple[int, ...]) -> dict | None:
        """The worker's answer for one message, or None when it died or hung."""
        try:
            self.ctl.send(msgpack.packb(list(codes)))
            if self.ctl.recv() != b"go":
                return None
            self.data.send_multipart(frames)
            self.ctl.send(b"sent")
            return msgpack.unpackb(self.ctl.recv())
        except zmq.Again:
            return None

    def stop(self) -> str:
        if self.proc.poll() is None:
            try:
                self.ctl.send(msgpack.packb([-1]))
                self.ctl.recv()
            except zmq.ZMQError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        err = self.proc.stderr.read().decode(errors="replace")[-2000:]
        self.proc.stderr.close()
        self.ctx.destroy(linger=0)
        return err


def compare(rep: Report, frames: list[bytes], want: dict, got: dict) -> None:
    if want["ok"] is None:
        rep.reference_errors += 1
        rep.note("the Python decoder raised (not WireError)", frames, {"python": want["python_error"], "op": got})
        if got["ok"]:
            rep.accepted += 1
        elif got["kind"] == "InvalidArgumentError":
            rep.rejected += 1
        else:
            rep.other_errors += 1
        return
    if got["ok"]:
        rep.accepted += 1
        if not want["ok"] and want["field"] == "extras":
            return  # the op does not read the msgpack telemetry, so it cannot reject it
        if not want["ok"] or got["tensors"] != want["tensors"]:
            rep.mismatches += 1
            rep.note("accepted, but the Python decoder says otherwise", frames, {"python": want})
        return
    if got["kind"] != "InvalidArgumentError":
        rep.other_errors += 1
        rep.note(f"failed with {got['kind']}", frames, got["error"])
        return
    rep.rejected += 1
    m = FIELD.search(got["error"].split("EP: ", 1)[-1])
    name = m.group(0) if m else "?"
    rep.fields[name] += 1
    if want["ok"]:
        rep.mismatches += 1
        rep.note("rejected, but the Python decoder accepts it", frames, got["error"])
    elif want["field"] == "extras":
        # The op skips the msgpack telemetry that Python rejects first, so it
        # may instead name a later field (frames, tensor[i].nbytes) or accept.
        return
    elif name != want["field"]:
        rep.mismatches += 1
        rep.note(f"names {name}, the Python decoder names {want['field']}", frames, got["error"])


def fuzz(count: int, seed: int, quiet: bool = False) -> Report:
    rep = Report()
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    pool = bases(rng)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fzq", dir="/tmp") as folder:
        n_workers = 0
        w = Worker(folder, n_workers)
        try:
            for k in range(count):
                r = rnd.random()
                base, codes = rnd.choice(pool)
                if r < 0.08:
                    frames = random_message(rnd)
                elif r < 0.082:
                    frames = many_frames(rnd)
                elif r < 0.12:
                    frames = base  # unmutated
                else:
                    frames = mutate(base, rnd)
                want = expected(frames, codes)
                got = w.ask(frames, codes)
                rep.sent += 1
                if got is None:
                    rep.crashes += 1
                    rep.note("worker died or hung", frames, w.stop())
                    n_workers += 1
                    w = Worker(folder, n_workers)
                    continue
                compare(rep, frames, want, got)
                if not quiet and (k + 1) % 10000 == 0:
                    print(f"  {k + 1} messages, {rep.crashes} crashes, {rep.mismatches} mismatches", file=sys.stderr)
            # A good message still arrives after all that.
            arrays = real_batches(rng)[0]
            codes = tuple(DTYPE_TO_CODE[a.dtype] for a in arrays)
            frames = [dump_arrays(arrays)]
            got = w.ask(frames, codes)
            rep.final_ok = bool(got and got["ok"] and got["tensors"] == expected(frames, codes)["tensors"])
        finally:
            w.stop()
    rep.seconds = time.monotonic() - started
    return rep


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="messages to send (default 100000)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    rep = fuzz(args.count, seed, quiet=args.json)
    summary = {
        "seed": seed,
        "sent": rep.sent,
        "accepted": rep.accepted,
        "rejected": rep.rejected,
        "crashes": rep.crashes,
        "other_errors": rep.other_errors,
        "mismatches": rep.mismatches,
        "reference_errors": rep.reference_errors,
        "final_message_ok": rep.final_ok,
        "seconds": round(rep.seconds, 1),
        "error_fields": dict(sorted(rep.fields.items())),
        "examples": rep.examples,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for key in ("seed", "sent", "accepted", "rejected", "crashes", "other_errors", "mismatches",
                    "reference_errors", "final_message_ok", "seconds"):  # fmt: skip
            print(f"{key:>17}: {summary[key]}")
        print("     error fields:")
        for name, n in summary["error_fields"].items():
            print(f"    {n:>10}  {name}")
        for ex in rep.examples:
            print(f"example: {json.dumps(ex)}")
    bad = rep.crashes or rep.other_errors or rep.mismatches or not rep.final_ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
