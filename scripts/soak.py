#!/usr/bin/env python3
"""Soak the zmq-consume input path and check that memory stays flat.

Runs producer processes -> the zmq_ops pull op -> a reduction over every
pixel, at full rate, for --duration seconds, and prints the resident memory
(RSS) of the trainer and of the producers (with their workers) after the
warm-up and at the end. Every queue is bounded by a high-water mark, so RSS
must not grow: the script exits 1 when either grows by more than --limit.

    python scripts/soak.py --duration 600      # the long run
    python scripts/soak.py --duration 30       # what CI runs
    python scripts/soak.py --transport shm --stage 4 --duration 600   # zero-copy slots held by staging
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from consumers.expect import receive_cap  # noqa: E402
from frameworks.tf_env import import_tf  # noqa: E402
from producers.commands import producer_argv as producer_command  # noqa: E402
from runner.producer_group import ProducerGroup  # noqa: E402

tf = import_tf()


def rss(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def tree(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            top = psutil.Process(pid)
            out += [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    """Stream for --duration seconds after the warm-up; exit 1 when the trainer's or producers' RSS grew."""
    args = _parse(argv)
    with tempfile.TemporaryDirectory(prefix="feedbench-soak-") as tmp:
        endpoint = f"ipc://{tmp}/soak" if args.transport == "ipc" else f"shm://soak-{Path(tmp).name}"
        sock, touched, fill = _graph(args, endpoint)
        cmds = [
            producer_command("synthetic", endpoint, 1000 * i, args.batch, args.image_size, "native", 1, 4)
            for i in range(args.producers)
        ]
        me = psutil.Process()
        with tf.compat.v1.Session() as sess, ProducerGroup(cmds, endpoint) as group:
            for _ in range(args.stage):
                sess.run(fill)
            _warm_up(sess, touched, me, args.warmup)
            producers = tree([p.pid for p in group.procs])
            start = (me.memory_info().rss, rss(producers))
            steps, elapsed = _stream(sess, touched, me, producers, args.duration)
            end = (me.memory_info().rss, rss(producers))
            group.check()
    return _report(args, sock, steps, elapsed, start, end)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of full-rate streaming after warm-up")
    ap.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of warm-up at least (it also waits for the RSS to settle)"
    )
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--limit", type=float, default=0.05, help="allowed RSS growth (fraction)")
    ap.add_argument(
        "--transport", choices=("ipc", "shm"), default="ipc",
        help="shm: the op's tensors are the producers' slots (zero copy), so held tensors hold slots",
    )  # fmt: skip
    ap.add_argument(
        "--stage", type=int, default=0, metavar="N",
        help="keep the last N batches in a StagingArea, as the trainer's staging does (0: none)",
    )  # fmt: skip
    return ap.parse_args(argv)


def _graph(args: argparse.Namespace, endpoint: str):
    """The pull op, optionally behind a StagingArea, and a reduction that touches every pixel: (sock, step, fill)."""
    import zmq_ops

    sock = zmq_ops.ZMQPullSocket(
        endpoint, [tf.uint8, tf.int32], hwm=4, bind=True, timeout_ms=30_000,
        max_msg_size=receive_cap(args.batch, args.image_size),
    )  # fmt: skip
    images, labels = sock.pull()
    fill = None
    if args.stage:  # batches wait in staging, as on a tower: over shm:// each holds its slot meanwhile
        from tensorflow.python.ops import data_flow_ops

        staging = data_flow_ops.StagingArea([tf.uint8, tf.int32], capacity=args.stage)
        fill = staging.put([images, labels])
        images, labels = staging.get()
        with tf.control_dependencies([images, labels]):
            refill = staging.put(sock.pull())
    touched = tf.reduce_sum(tf.cast(images, tf.int32)) + tf.reduce_sum(labels)
    if fill is not None:
        touched = tf.group(touched, refill)
    return sock, touched, fill


def _warm_up(sess, touched, me: psutil.Process, warmup: float) -> None:
    """Warm-up lasts `warmup` seconds and until the trainer's RSS has settled (within 1% for 2 s; at most a
    minute): a loaded machine takes longer to reach its allocators' steady state, which is not a leak."""
    t_warm = time.monotonic()
    settled_rss, settled_at = me.memory_info().rss, t_warm
    while True:
        sess.run(touched)
        now, now_rss = time.monotonic(), me.memory_info().rss
        if abs(now_rss - settled_rss) > 0.01 * settled_rss:
            settled_rss, settled_at = now_rss, now
        if now - t_warm >= warmup and (now - settled_at >= 2.0 or now - t_warm >= 60.0):
            break


def _stream(sess, touched, me: psutil.Process, producers: list[psutil.Process], duration: float) -> tuple[int, float]:
    """Full-rate steps for `duration` seconds, RSS printed every 10 s: (steps, seconds)."""
    t0, n = time.monotonic(), 0
    next_report = t0 + 10
    while time.monotonic() < t0 + duration:
        sess.run(touched)
        n += 1
        if time.monotonic() >= next_report:
            next_report += 10
            print(f"  {time.monotonic() - t0:5.0f} s  trainer RSS {me.memory_info().rss / 2**20:7.1f} MiB  "
                  f"producers RSS {rss(producers) / 2**20:7.1f} MiB", flush=True)  # fmt: skip
    return n, time.monotonic() - t0


def _report(args: argparse.Namespace, sock, steps: int, elapsed: float, start: tuple, end: tuple) -> int:
    """The soak's rate and each side's RSS growth; 1 when either grew more than --limit."""
    ok = True
    print(
        f"\nsoak: {args.producers} producers -> zmq_ops op over {args.transport}"
        f"{' (zero copy: ' + str(sock.zero_copy) + ')' if args.transport == 'shm' else ''}"
        f"{f', {args.stage} batches held in staging' if args.stage else ''}, "
        f"{args.batch}x{args.image_size}x{args.image_size}x3 uint8, {elapsed:.0f} s"
    )
    print(
        f"  {steps / elapsed * args.batch:.0f} images/s, {steps * args.batch * args.image_size**2 * 3 / elapsed / 1e9:.2f} GB/s"
    )
    for name, a, b in (("trainer", start[0], end[0]), ("producers", start[1], end[1])):
        growth = (b - a) / a
        verdict = "ok" if growth <= args.limit else f"GREW more than {args.limit:.0%}"
        ok &= growth <= args.limit
        print(f"  {name:9s} RSS {a / 2**20:8.1f} MiB -> {b / 2**20:8.1f} MiB ({growth:+.1%}) {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
