"""Input-only throughput of the zmq_ops op, next to the Python ways of feeding TensorFlow.

    python -m benchmarks.bench_op [--steps 50] [--repeats 5] [--transports shm,ipc,tcp]

A real producer process (`python -m producers synthetic`) pushes batches of
64x224x224x3 uint8 images and int32 labels; the consumer (this process)
binds, receives them into tensors and runs a trivial op that reads the images
(the max over every pixel), in a tf.compat.v1 session loop. Each path is
timed as a warm-up then `--repeats` runs of `--steps` steps; the table gives
the median (and min..max) in GB/s of batch data, images/s, and the ratio to
single-core memcpy bandwidth measured in the same run (np.copyto on 256 MB).

Paths: the op (both wire formats over ipc:// and tcp://, and shm://, where
the batch sits in the producer's shared-memory slot and only a slot message
crosses ZMQ); the TF-free native receiver (zmq_ops.receiver, what the PyTorch
trainer reads with) into numpy slots; pyzmq + a
tf.data.Dataset.from_generator; pyzmq + a FIFOQueue fed by feed_dict from a
Python thread; and pyzmq alone with no TensorFlow (the wire's ceiling).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq
from tabulate import tabulate

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

import zmq_ops  # noqa: E402
from benchmarks.memcpy import memcpy_bandwidth  # noqa: E402
from producers.commands import producer_command  # noqa: E402
from wire import message  # noqa: E402
from wire.endpoints import free_tcp_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# Used only when the project's producers package is not there.
PRIVATE_SENDER = """
import sys, numpy as np, zmq
from wire import message
endpoint, fmt, batch, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
pool = [(rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8),
         rng.integers(0, 1000, (batch,), dtype=np.int32)) for _ in range(4)]
sock = zmq.Context().socket(zmq.PUSH)
sock.setsockopt(zmq.SNDHWM, 4)
sock.connect(endpoint)
i = 0
while True:
    message.send(sock, list(pool[i % 4]), fmt=fmt, seq=i)
    i += 1
"""


@dataclass
class Config:
    batch: int
    image_size: int
    steps: int
    repeats: int
    warmup: int
    hwm: int
    producer_workers: int = 1

    @property
    def batch_bytes(self) -> int:
        return self.batch * self.image_size * self.image_size * 3 + self.batch * 4


@dataclass
class Row:
    path: str
    transport: str
    fmt: str
    seconds: list[float]  # per repeat of `steps` steps


# ---------------------------------------------------------------- helpers


def memcpy_gbps(nbytes: int = 256 << 20, repeats: int = 7) -> float:
    """Single-core memcpy bandwidth in GB/s, median of repeats (the same reference as bench_wire)."""
    return memcpy_bandwidth(nbytes, repeats).median / 1e9


@contextmanager
def endpoint(transport: str) -> Iterator[str]:
    """A fresh endpoint on this machine only."""
    if transport == "shm":
        yield f"shm://zqb-{os.getpid()}-{time.monotonic_ns()}"
        return
    if transport == "tcp":
        yield f"tcp://127.0.0.1:{free_tcp_port()}"
        return
    folder = tempfile.mkdtemp(prefix="zqb", dir="/tmp")
    try:
        yield f"ipc://{folder}/feed"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_PROJECT_PRODUCER: bool | None = None


def project_producer_works() -> bool:
    """Whether `python -m producers synthetic` can run here; else the private sender is used."""
    global _PROJECT_PRODUCER
    if _PROJECT_PRODUCER is None:
        ok = importlib.util.find_spec("producers") is not None
        if ok:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            probe = subprocess.run([sys.executable, "-m", "producers", "synthetic", "--help"], env=env, cwd=ROOT,
                                   capture_output=True, text=True, timeout=120)  # fmt: skip
            ok = probe.returncode == 0
            if not ok:
                last = (probe.stderr.strip().splitlines() or ["?"])[-1]
                print(f"producer: `python -m producers synthetic` fails here ({last}); using a private sender")
        else:
            print("producer: private sender (the producers package is not installed)")
        _PROJECT_PRODUCER = ok
    return _PROJECT_PRODUCER


@contextmanager
def producer(ep: str, fmt: str, cfg: Config) -> Iterator[None]:
    """A producer process connected to `ep`, stopped (with its workers) on exit."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if project_producer_works():
        cmd = producer_command(
            "synthetic", ep, cfg.batch, cfg.image_size, workers=cfg.producer_workers, fmt=fmt, extra=["--hwm", "4"]
        )
    else:
        cmd = [sys.executable, "-c", PRIVATE_SENDER, ep, fmt, str(cfg.batch), str(cfg.image_size)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    try:
        yield
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def consume(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """A trivial op that really reads every byte of the batch: the images' max plus the labels' sum.

    (A sum over a strided slice costs TensorFlow ~5x more than reading the
    whole batch once with reduce_max, and would measure the slice, not the input.)
    """
    return tf.cast(tf.reduce_max(images), tf.int32) + tf.reduce_sum(labels)


def time_steps(step: Callable[[], object], cfg: Config) -> list[float]:
    for _ in range(cfg.warmup):
        step()
    out = []
    for _ in range(cfg.repeats):
        t = time.perf_counter()
        for _ in range(cfg.steps):
            step()
        out.append(time.perf_counter() - t)
    return out


def _shapes(cfg: Config) -> tuple[list[int], list[int]]:
    return [cfg.batch, cfg.image_size, cfg.image_size, 3], [cfg.batch]


# ---------------------------------------------------------------- the paths


def run_op(transport: str, fmt: str, cfg: Config, zero_copy: bool = False) -> Row:
    """ZMQPullSocket -> consume, one session.run per batch; `zero_copy`: the outputs are the shm slots."""
    with endpoint(transport) as ep:
        graph = tf.Graph()
        with graph.as_default():
            sock = zmq_ops.ZMQPullSocket(ep, [tf.uint8, tf.int32], hwm=cfg.hwm, timeout_ms=60_000, zero_copy=zero_copy)
            images, labels = sock.pull()
            out = consume(images, labels)
        name = "zmq_ops op, zero-copy" if sock.zero_copy else "zmq_ops op"
        with tf.compat.v1.Session(graph=graph) as sess, producer(ep, fmt, cfg):
            return Row(name, transport, fmt, time_steps(lambda: sess.run(out), cfg))


def run_receiver(transport: str, fmt: str, cfg: Config, zero_copy: bool = False) -> Row:
    """The TF-free native receiver (zmq_ops.receiver): a ring of 4 numpy slots (next + release), or zero-copy
    arrays over the batch in place (dropped after use)."""
    from zmq_ops.receiver import Receiver

    im_shape, lb_shape = _shapes(cfg)
    specs = [("uint8", tuple(im_shape)), ("int32", tuple(lb_shape))]
    if zero_copy:
        with endpoint(transport) as ep, Receiver(ep, specs, 4, hwm=cfg.hwm, timeout_ms=60_000, zero_copy=True) as r:
            with producer(ep, fmt, cfg):

                def step_in_place() -> None:
                    images, _ = r.next_arrays()
                    int(images[0, 0, 0, 0])  # the caller would now copy the batch to the device

                return Row("native receiver (no TF), zero-copy", transport, fmt, time_steps(step_in_place, cfg))
    ring = [[np.empty(shape, dtype) for dtype, shape in specs] for _ in range(4)]
    with endpoint(transport) as ep, Receiver(ep, specs, ring, hwm=cfg.hwm, timeout_ms=60_000) as r:
        with producer(ep, fmt, cfg):

            def step() -> None:
                i = r.next()
                int(ring[i][0][0, 0, 0, 0])  # the caller would now copy the slot to the device
                r.release(i)

            return Row("native receiver (no TF)", transport, fmt, time_steps(step, cfg))


def _pyzmq_pull(ep: str, cfg: Config) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.setsockopt(zmq.RCVHWM, cfg.hwm)
    s.setsockopt(zmq.RCVBUF, 4 << 20)  # what the op's socket uses, for a fair comparison
    s.setsockopt(zmq.RCVTIMEO, 60_000)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(ep)
    return ctx, s


def run_from_generator(transport: str, fmt: str, cfg: Config) -> Row:
    """pyzmq recv (no copy) -> tf.data.Dataset.from_generator (copies into tensors) -> consume."""
    with endpoint(transport) as ep:
        ctx, s = _pyzmq_pull(ep, cfg)
        stop = threading.Event()
        try:

            def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
                # tf.data may call this from a prefetch thread after the last
                # step; poll so that it ends promptly once the run is over.
                while not stop.is_set():
                    if s.poll(100, zmq.POLLIN):
                        images, labels = message.recv(s).arrays
                        yield images, labels

            im_shape, lb_shape = _shapes(cfg)
            graph = tf.Graph()
            with graph.as_default():
                ds = tf.data.Dataset.from_generator(
                    gen,
                    output_signature=(tf.TensorSpec(im_shape, tf.uint8), tf.TensorSpec(lb_shape, tf.int32)),
                )
                images, labels = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
                out = consume(images, labels)
            with tf.compat.v1.Session(graph=graph) as sess, producer(ep, fmt, cfg):
                try:
                    return Row("pyzmq + from_generator", transport, fmt, time_steps(lambda: sess.run(out), cfg))
                finally:
                    stop.set()
        finally:
            ctx.destroy(linger=0)


def run_fifo_queue(transport: str, fmt: str, cfg: Config) -> Row:
    """pyzmq recv -> feed_dict enqueue from a Python thread -> FIFOQueue -> dequeue -> consume."""
    with endpoint(transport) as ep:
        ctx, s = _pyzmq_pull(ep, cfg)
        stop = threading.Event()
        try:
            im_shape, lb_shape = _shapes(cfg)
            graph = tf.Graph()
            with graph.as_default():
                ph_images = tf.compat.v1.placeholder(tf.uint8, im_shape)
                ph_labels = tf.compat.v1.placeholder(tf.int32, lb_shape)
                q = tf.queue.FIFOQueue(cfg.hwm, [tf.uint8, tf.int32], shapes=[im_shape, lb_shape])
                enqueue = q.enqueue([ph_images, ph_labels])
                close = q.close(cancel_pending_enqueues=True)
                images, labels = q.dequeue()
                out = consume(images, labels)
            with tf.compat.v1.Session(graph=graph) as sess, producer(ep, fmt, cfg):

                def feed() -> None:
                    while not stop.is_set():
                        if not s.poll(100, zmq.POLLIN):
                            continue
                        try:
                            im, lb = message.recv(s).arrays
                            sess.run(enqueue, feed_dict={ph_images: im, ph_labels: lb})
                        except (zmq.Again, tf.errors.CancelledError):
                            return

                t = threading.Thread(target=feed, daemon=True)
                t.start()
                try:
                    return Row("pyzmq + FIFOQueue feed", transport, fmt, time_steps(lambda: sess.run(out), cfg))
                finally:
                    stop.set()
                    sess.run(close)
                    t.join(timeout=70)
        finally:
            ctx.destroy(linger=0)


def run_pyzmq_only(transport: str, fmt: str, cfg: Config) -> Row:
    """pyzmq recv without copies and without TensorFlow: what the wire alone delivers."""
    with endpoint(transport) as ep:
        ctx, s = _pyzmq_pull(ep, cfg)
        try:
            with producer(ep, fmt, cfg):
                return Row("pyzmq recv only (no TF)", transport, fmt, time_steps(lambda: message.recv(s), cfg))
        finally:
            ctx.destroy(linger=0)


def consume_only_ms(cfg: Config) -> float:
    """The consumer op alone on a batch already in memory, ms per step."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        images = tf.Variable(rng.integers(0, 256, _shapes(cfg)[0], dtype=np.uint8))
        labels = tf.Variable(np.zeros(cfg.batch, np.int32))
        out = consume(images.read_value(), labels.read_value())
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        return statistics.median(time_steps(lambda: sess.run(out), cfg)) / cfg.steps * 1e3


# ---------------------------------------------------------------- report


def report(rows: list[Row], cfg: Config, memcpy: float) -> str:
    table = []
    for r in rows:
        rates = [cfg.steps * cfg.batch_bytes / t / 1e9 for t in r.seconds]
        med = statistics.median(rates)
        table.append(
            [
                r.path,
                r.transport,
                r.fmt,
                f"{med:.2f}",
                f"{min(rates):.2f}..{max(rates):.2f}",
                f"{med * 1e9 / cfg.batch_bytes * cfg.batch:,.0f}",
                f"{med / memcpy:.0%}",
            ]  # fmt: skip
        )
    headers = ["path", "transport", "format", "GB/s", "min..max", "images/s", "of memcpy"]
    return tabulate(table, headers=headers, colalign=("left", "left", "left", "right", "right", "right", "right"))


def median_gbps(rows: list[Row], path: str, transport: str, fmt: str, cfg: Config) -> float | None:
    for r in rows:
        if (r.path, r.transport, r.fmt) == (path, transport, fmt):
            return statistics.median(cfg.steps * cfg.batch_bytes / t / 1e9 for t in r.seconds)
    return None


def main(argv: list[str] | None = None) -> int:
    """Every chosen path over every chosen transport and format; the table, then where a batch's time goes."""
    args = _parse(argv)
    cfg = Config(args.batch, args.image_size, args.steps, args.repeats, args.warmup, args.hwm, args.producer_workers)
    transports = args.transports.split(",")
    formats = args.formats.split(",")

    memcpy = memcpy_gbps()
    print(f"single-core memcpy (np.copyto, 256 MB, median of 7): {memcpy:.2f} GB/s", flush=True)
    print(f"batch: {cfg.batch}x{cfg.image_size}x{cfg.image_size}x3 uint8 + int32 labels = "
          f"{cfg.batch_bytes / 1e6:.2f} MB; {cfg.warmup} warm-up, then {cfg.repeats} x {cfg.steps} steps",
          flush=True)  # fmt: skip
    if project_producer_works():
        print(f"producer: python -m producers synthetic ({cfg.producer_workers} worker process(es); over shm:// "
              "each writes every batch into its slot anew, as a decoding producer must)")  # fmt: skip

    # The Python paths read raw pyzmq sockets: they run on the first socket transport.
    py_transport = next((t for t in transports if t != "shm"), "ipc")
    rows = _measure(args.paths.split(","), transports, formats, py_transport, cfg)
    print()
    print(report(rows, cfg, memcpy))
    _summary(rows, transports, py_transport, memcpy, cfg)
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_op", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="images per batch")
    parser.add_argument("--image-size", type=int, default=224, help="image height and width")
    parser.add_argument("--steps", type=int, default=50, help="batches per timed repeat")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    parser.add_argument("--warmup", type=int, default=10, help="batches before timing starts")
    parser.add_argument("--hwm", type=int, default=4, help="receive high-water mark / queue capacity, in batches")
    parser.add_argument("--producer-workers", type=int, default=1,
                        help="worker processes of the producer (each writes every batch anew)")  # fmt: skip
    parser.add_argument("--transports", default="shm,ipc,tcp", help="comma-separated: shm,ipc,tcp")
    parser.add_argument("--formats", default="native,zmq_ops", help="wire formats for the op rows")
    parser.add_argument("--paths", default="op,receiver,generator,queue,pyzmq",
                        help="comma-separated: op, receiver (the TF-free native receiver), generator "
                        "(from_generator), queue (FIFOQueue feed), pyzmq (recv only)")  # fmt: skip
    return parser.parse_args(argv)


def _measure(paths: list[str], transports: list[str], formats: list[str], py_transport: str, cfg: Config) -> list[Row]:
    """One row per path, transport and format measured (the op's and receiver's shm:// rows also zero-copy)."""
    rows: list[Row] = []
    if "op" in paths:
        for transport in transports:
            for fmt in formats:
                if transport == "shm" and fmt != "native":
                    continue  # shm:// carries slot messages, which are native headers
                rows.append(run_op(transport, fmt, cfg))
                print(f"  done: op {transport} {fmt}", file=sys.stderr, flush=True)
                if transport == "shm":
                    rows.append(run_op(transport, fmt, cfg, zero_copy=True))
                    print(f"  done: op {transport} {fmt} zero-copy", file=sys.stderr, flush=True)
    if "receiver" in paths:
        for transport in transports:
            rows.append(run_receiver(transport, "native", cfg))
            print(f"  done: receiver {transport}", file=sys.stderr, flush=True)
            if transport == "shm":
                rows.append(run_receiver(transport, "native", cfg, zero_copy=True))
                print(f"  done: receiver {transport} zero-copy", file=sys.stderr, flush=True)
    python_paths = {"generator": run_from_generator, "queue": run_fifo_queue, "pyzmq": run_pyzmq_only}
    for name, run in python_paths.items():
        if name in paths:
            rows.append(run(py_transport, "native", cfg))
            print(f"  done: {rows[-1].path}", file=sys.stderr, flush=True)

    return rows


def _summary(rows: list[Row], transports: list[str], py_transport: str, memcpy: float, cfg: Config) -> None:
    """The op against memcpy and from_generator, and where a batch's time goes on the first socket transport."""
    gen = median_gbps(rows, "pyzmq + from_generator", py_transport, "native", cfg)
    print()
    for transport in transports:
        for name in ("zmq_ops op", "zmq_ops op, zero-copy"):
            op_t = median_gbps(rows, name, transport, "native", cfg)
            if op_t:
                vs_gen = f", {op_t / gen:.1f}x pyzmq + from_generator ({py_transport})" if gen else ""
                print(f"{name} over {transport} (native): {op_t / memcpy:.0%} of memcpy{vs_gen}")
    op = median_gbps(rows, "zmq_ops op", py_transport, "native", cfg)
    wire = median_gbps(rows, "pyzmq recv only (no TF)", py_transport, "native", cfg)
    if op:
        mb = cfg.batch_bytes / 1e6
        print(f"\nwhere a batch's time goes ({py_transport}, native, ms per batch):")
        parts = [("whole op path (receive + copy + consume)", mb / op)]
        if wire:
            parts.append(("the wire alone (pyzmq recv, no copy, no TF)", mb / wire))
        parts.append(("the op's one memcpy, at memcpy speed", mb / memcpy))
        parts.append(("the consumer op on a batch already in memory", consume_only_ms(cfg)))
        for label, ms in parts:
            print(f"  {label:<46}{ms:7.2f}")


if __name__ == "__main__":
    sys.exit(main())
