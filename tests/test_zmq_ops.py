"""The zmq_ops op over real sockets: both wire formats, every test vector, errors,
timeouts, reconnects, several pulls in flight, graph mode, tf.data, eager mode,
and tensorpack's own ZMQInput / send_dataflow_zmq against our op.

Graph-mode tests build their own tf.Graph, so they work whether or not the
process has turned v2 behaviour off; eager checks run in a child process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
zmq_ops = pytest.importorskip("zmq_ops.tf_op", reason="zmq_ops op not built (run `make op`)")
import tensorflow as tf  # noqa: E402

from wire import message  # noqa: E402
from wire.endpoints import free_tcp_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VECTORS = json.loads((ROOT / "wire" / "vectors.json").read_text())
TF_TYPES = {
    "float32": tf.float32,
    "float64": tf.float64,
    "int32": tf.int32,
    "uint8": tf.uint8,
    "int16": tf.int16,
    "int8": tf.int8,
    "int64": tf.int64,
    "bool": tf.bool,
    "uint16": tf.uint16,
    "float16": tf.float16,
    "uint32": tf.uint32,
    "uint64": tf.uint64,
    "bytes": tf.string,  # a batch of byte strings (wire/strings.py)
}
RECV_TIMEOUT_MS = 20_000  # only ever reached when something is broken


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def ipc() -> Iterator[str]:
    """A fresh ipc:// endpoint in a short private folder (socket paths are limited to ~100 bytes)."""
    folder = tempfile.mkdtemp(prefix="zq", dir="/tmp")
    try:
        yield f"ipc://{folder}/sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def push() -> Iterator[zmq.Context]:
    """A pyzmq context for in-test senders, closed without lingering."""
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


class Graph:
    """A graph, its session, and pull ops built on one ZMQPullSocket."""

    def __init__(self, endpoint: str, types: list[tf.DType], **kwargs: object) -> None:
        self.graph = tf.Graph()
        with self.graph.as_default():
            kwargs.setdefault("timeout_ms", RECV_TIMEOUT_MS)
            self.sock = zmq_ops.ZMQPullSocket(endpoint, types, **kwargs)
            self.pull = self.sock.pull()
        self.sess = tf.compat.v1.Session(graph=self.graph)

    def run(self, fetches: object = None) -> object:
        return self.sess.run(self.pull if fetches is None else fetches)

    def close(self) -> None:
        self.sess.close()  # destroys the connection resource, closing the socket


@pytest.fixture
def graphs() -> Iterator[list[Graph]]:
    made: list[Graph] = []
    try:
        yield made
    finally:
        for g in made:
            g.close()


def frames_of(vector: dict) -> list[bytes]:
    return [bytes.fromhex(f) for f in vector["frames"]]


def connect_push(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


SENDER = textwrap.dedent(
    """
    import sys, time
    import numpy as np, zmq
    from wire import message
    endpoint, fmt, count, bind, first = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "bind", int(sys.argv[5])
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 2)
    (s.bind if bind else s.connect)(endpoint)
    print("ready", flush=True)
    i = first
    while count < 0 or i < first + count:
        images = np.full((2, 4, 4, 3), i % 256, np.uint8)
        labels = np.array([i, -i], np.int32)
        message.send(s, [images, labels], fmt=fmt, seq=i)
        i += 1
    # Stay up until killed: ZMQ drops batches still in flight beyond the
    # receiver's high-water mark when their sender goes away.
    time.sleep(3600)
    """
)


class Sender:
    """A producer in its own process: sends batch i as images filled with i and labels [i, -i]."""

    def __init__(self, endpoint: str, fmt: str = "native", count: int = -1, bind: bool = False, first: int = 0):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        args = [sys.executable, "-c", SENDER, endpoint, fmt, str(count), "bind" if bind else "connect", str(first)]
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture
def senders() -> Iterator[list[Sender]]:
    made: list[Sender] = []
    try:
        yield made
    finally:
        for s in made:
            s.stop()


def batch_index(out: list[np.ndarray]) -> int:
    images, labels = out
    assert images.shape == (2, 4, 4, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int32 and labels[1] == -labels[0]
    assert (images == labels[0] % 256).all()
    return int(labels[0])


# ---------------------------------------------------------------- format and vectors


def test_dump_arrays_gives_tensorpack_bytes() -> None:
    arrays = [np.arange(24, dtype=np.uint8).reshape(2, 3, 4), np.array([7, -1], np.int32)]
    buf = zmq_ops.dump_arrays(arrays)
    assert len(buf) == 84
    assert buf == frames_of(VECTORS["valid"][0])[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("vector", VECTORS["valid"], ids=lambda v: v["name"])
def test_valid_vector_gives_its_tensors(vector: dict, ipc: str, push: zmq.Context, graphs: list[Graph]) -> None:
    types = [TF_TYPES[t["dtype"]] for t in vector["tensors"]]
    g = Graph(ipc, types)
    graphs.append(g)
    s = connect_push(push, ipc)
    s.send_multipart(frames_of(vector))
    out = g.run()
    if not types:  # an op with no outputs: running it must simply succeed
        return
    assert len(out) == len(vector["tensors"])
    for got, want in zip(out, vector["tensors"], strict=True):
        if want["dtype"] == "bytes":  # tf.string: each item its own bytes
            assert [bytes(b) for b in got] == [bytes.fromhex(x) for x in want["data"]]
            continue
        expected = np.array(want["data"], dtype=want["dtype"]).reshape(want["shape"])
        assert got.dtype == expected.dtype
        assert got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


@pytest.mark.timeout(120)
def test_invalid_vectors_name_their_field_and_the_socket_survives(
    ipc: str, push: zmq.Context, graphs: list[Graph]
) -> None:
    g = Graph(ipc, [tf.uint8, tf.int32])
    graphs.append(g)
    s = connect_push(push, ipc)
    good = [np.arange(6, dtype=np.uint8).reshape(2, 3), np.array([5], np.int32)]
    for vector in VECTORS["invalid"]:
        s.send_multipart(frames_of(vector))
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            g.run()
        text = err.value.message
        assert vector["field"] in text, (vector["name"], text)
        assert ipc in text  # the endpoint is named
        # the next good message still arrives, in either format
        message.send(s, good, fmt="native" if len(text) % 2 else "zmq_ops")
        images, labels = g.run()
        np.testing.assert_array_equal(images, good[0])
        np.testing.assert_array_equal(labels, good[1])


@pytest.mark.timeout(120)
def test_error_messages_carry_the_values(ipc: str, push: zmq.Context, graphs: list[Graph]) -> None:
    g = Graph(ipc, [tf.uint8])
    graphs.append(g)
    s = connect_push(push, ipc)
    by_field = {v["field"] + v["format"]: v for v in VECTORS["invalid"]}
    cases = [
        (by_field["tensor[0].nbytes" + "zmq_ops"], ["23", "[2, 3, 4]", "24"]),
        (by_field["tensor[0].ndim" + "native"], ["9", "0..8"]),
        (by_field["tensor[0].shape[0]" + "zmq_ops"], ["-2"]),
        (by_field["version" + "native"], ["9"]),
        (by_field["tensor[0].dtype" + "native"], ["77"]),
    ]
    for vector, values in cases:
        s.send_multipart(frames_of(vector))
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            g.run()
        for v in values:
            assert v in err.value.message, (vector["name"], err.value.message)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["native", "zmq_ops"])
def test_declared_types_are_checked(fmt: str, ipc: str, push: zmq.Context, graphs: list[Graph]) -> None:
    g = Graph(ipc, [tf.uint8, tf.int32])
    graphs.append(g)
    s = connect_push(push, ipc)
    images, labels = np.zeros((2, 2), np.uint8), np.array([1], np.int32)

    message.send(s, [images, labels.astype(np.int64)], fmt=fmt)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor\[1\]\.dtype.*int64.*int32"):
        g.run()
    message.send(s, [images], fmt=fmt)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"n_tensors.* 1 tensors.* expects 2"):
        g.run()
    message.send(s, [images, labels, labels], fmt=fmt)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"n_tensors.* 3 tensors.* expects 2"):
        g.run()
    message.send(s, [images, labels], fmt=fmt)
    got_images, got_labels = g.run()
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)


@pytest.mark.timeout(120)
def test_bool_bytes_other_than_zero_and_one_become_true(ipc: str, push: zmq.Context, graphs: list[Graph]) -> None:
    g = Graph(ipc, [tf.bool])
    graphs.append(g)
    s = connect_push(push, ipc)
    raw = np.array([0, 1, 2, 255], np.uint8)
    s.send(zmq_ops.dump_arrays([raw]).replace(b"\x04\x00\x00\x00\x01\x00", b"\x0a\x00\x00\x00\x01\x00", 1))
    (got,) = g.run()
    assert got.tolist() == [False, True, True, True]


# ---------------------------------------------------------------- processes, timeouts, reconnects


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["native", "zmq_ops"])
def test_batches_from_a_producer_process(fmt: str, ipc: str, graphs: list[Graph], senders: list[Sender]) -> None:
    g = Graph(ipc, [tf.uint8, tf.int32])
    graphs.append(g)
    senders.append(Sender(ipc, fmt, count=20))
    assert [batch_index(g.run()) for _ in range(20)] == list(range(20))


@pytest.mark.timeout(60)
def test_timeout_fails_with_deadline_exceeded_naming_the_endpoint(ipc: str, graphs: list[Graph]) -> None:
    g = Graph(ipc, [tf.uint8], timeout_ms=300)
    graphs.append(g)
    with pytest.raises(tf.errors.DeadlineExceededError) as err:
        g.run()
    assert ipc in err.value.message
    assert "300 ms" in err.value.message


@pytest.mark.timeout(120)
def test_restarted_sender_is_picked_up_again(graphs: list[Graph], senders: list[Sender]) -> None:
    """The op connects, the producer binds, dies and comes back on the same port: ZMQ reconnects."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    g = Graph(endpoint, [tf.uint8, tf.int32], bind=False)
    graphs.append(g)
    first = Sender(endpoint, "native", count=-1, bind=True, first=0)
    senders.append(first)
    seen = [batch_index(g.run()) for _ in range(3)]
    assert seen == [0, 1, 2]
    first.stop()
    # Drain what reached our side before the producer died (queues and kernel
    # buffers hold many small batches), then batches come from the new one.
    second = Sender(endpoint, "zmq_ops", count=-1, bind=True, first=1_000_000)
    senders.append(second)
    last = seen[-1]
    while (i := batch_index(g.run())) < 1_000_000:
        assert i == last + 1  # the old stream, in order, nothing invented
        last = i
    assert i >= 1_000_000


@pytest.mark.timeout(120)
def test_consumer_bind_takes_a_new_producer_after_the_first_exits(
    ipc: str, graphs: list[Graph], senders: list[Sender]
) -> None:
    g = Graph(ipc, [tf.uint8, tf.int32])
    graphs.append(g)
    senders.append(Sender(ipc, "native", count=5))
    assert [batch_index(g.run()) for _ in range(5)] == list(range(5))
    senders[0].stop()
    senders.append(Sender(ipc, "zmq_ops", count=5, first=100))
    assert [batch_index(g.run()) for _ in range(5)] == list(range(100, 105))


@pytest.mark.timeout(120)
def test_max_msg_size_disconnects_an_oversize_peer(ipc: str, push: zmq.Context, graphs: list[Graph]) -> None:
    g = Graph(ipc, [tf.uint8], max_msg_size=4096, timeout_ms=500)
    graphs.append(g)
    s = connect_push(push, ipc)
    message.send(s, [np.zeros(100_000, np.uint8)], fmt="native")
    with pytest.raises(tf.errors.DeadlineExceededError):
        g.run()  # the big frame never becomes a tensor
    # The peer reconnects by itself; small batches flow again.
    stop = threading.Event()

    def keep_sending() -> None:
        while not stop.is_set():
            try:
                message.send(s, [np.full(10, 7, np.uint8)], fmt="native", flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
            time.sleep(0.01)

    t = threading.Thread(target=keep_sending)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                (got,) = g.run()
                break
            except tf.errors.DeadlineExceededError:
                assert time.monotonic() < deadline, "no small batch arrived after the oversize one"
        assert got.tolist() == [7] * 10
    finally:
        stop.set()
        t.join()


# ---------------------------------------------------------------- concurrency, graph mode, tf.data


@pytest.mark.timeout(120)
def test_several_pulls_in_flight_each_get_a_distinct_batch(
    ipc: str, graphs: list[Graph], senders: list[Sender]
) -> None:
    """One pull per tower in one step: every batch arrives exactly once, whole."""
    towers = 4
    g = Graph(ipc, [tf.uint8, tf.int32])
    graphs.append(g)
    with g.graph.as_default():
        pulls = [g.sock.pull() for _ in range(towers)]
    senders.append(Sender(ipc, "native", count=towers * 10))
    seen: list[int] = []
    for _ in range(10):
        seen += [batch_index(out) for out in g.run(pulls)]
    assert sorted(seen) == list(range(towers * 10))


@pytest.mark.timeout(120)
def test_counters_follow_arrival_order_with_pulls_in_flight(ipc: str, push: zmq.Context, graphs: list[Graph]) -> None:
    """Five pulls per step race for messages; the per-producer counters still see them in arrival order."""
    towers = 5
    g = Graph(ipc, [tf.int32])
    graphs.append(g)
    with g.graph.as_default():
        pulls = [g.sock.pull() for _ in range(towers)]
        stats = g.sock.stats()
    plan = [(7, seq) for seq in range(50)] + [(7, seq) for seq in range(53, 60)]  # 3 lost
    plan += [(9, seq) for seq in range(20)] + [(9, 19)] + [(9, seq) for seq in range(5)]  # 1 repeat, 1 restart
    s = connect_push(push, ipc)
    for producer, seq in plan:  # one connection, so arrival order is this order
        message.send(s, [np.array([seq], np.int32)], fmt="native", producer_id=producer, seq=seq)
    for seq in range(2):
        message.send(s, [np.array([seq], np.int32)], fmt="zmq_ops")
    sent = len(plan) + 2
    assert sent % towers == 0
    for _ in range(sent // towers):
        g.run(pulls)
    rows, totals = g.run(stats)
    keys = ("producer", "received", "lost", "duplicated", "restarts")
    got = {int(r[0]): dict(zip(keys, map(int, r), strict=True)) for r in rows}
    assert got == {
        7: {"producer": 7, "received": 57, "lost": 3, "duplicated": 0, "restarts": 0},
        9: {"producer": 9, "received": 26, "lost": 0, "duplicated": 1, "restarts": 1},
    }
    assert int(totals[0]) == sent


@pytest.mark.timeout(120)
def test_blocked_pulls_do_not_starve_other_ops(ipc: str, push: zmq.Context, graphs: list[Graph]) -> None:
    """More blocked pulls than TF has inter-op threads, yet an unrelated op in the same step still runs."""
    g = Graph(ipc, [tf.int32])
    graphs.append(g)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    g.sess.close()
    g.sess = tf.compat.v1.Session(graph=g.graph, config=config)
    with g.graph.as_default():
        pulls = [g.sock.pull() for _ in range(3)]
        other = tf.constant(41) + 1
        q = tf.queue.FIFOQueue(1, [tf.int32])
        signal = q.enqueue([other])
        dequeue = q.dequeue()
    s = connect_push(push, ipc)
    result: dict[str, object] = {}

    def step() -> None:
        result["out"] = g.sess.run([pulls, signal])

    t = threading.Thread(target=step)
    t.start()
    # The enqueue in the same step completes while the pulls wait.
    assert g.sess.run(dequeue, options=tf.compat.v1.RunOptions(timeout_in_ms=20_000)) == 42
    for i in range(3):
        message.send(s, [np.array([i], np.int32)], fmt="native")
    t.join(timeout=60)
    assert not t.is_alive()
    assert sorted(int(p[0][0]) for p in result["out"][0]) == [0, 1, 2]


@pytest.mark.timeout(120)
def test_dataset_in_graph_mode(ipc: str, senders: list[Sender]) -> None:
    graph = tf.Graph()
    with graph.as_default():
        ds = zmq_ops.dataset(ipc, [tf.uint8, tf.int32], shapes=[[2, 4, 4, 3], [2]], timeout_ms=RECV_TIMEOUT_MS)
        ds = ds.batch(2, drop_remainder=True)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        images, labels = it.get_next()
        assert images.shape.as_list() == [2, 2, 4, 4, 3]
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(it.initializer)
        senders.append(Sender(ipc, "zmq_ops", count=6))
        got = []
        for _ in range(3):
            im, lb = sess.run([images, labels])
            got += [batch_index([im[k], lb[k]]) for k in range(2)]
    assert got == list(range(6))


@pytest.mark.timeout(120)
def test_eager_mode_in_a_fresh_process(ipc: str, senders: list[Sender]) -> None:
    """Eager pulls and an eager tf.data loop, in a process whose TF keeps v2 behaviour."""
    code = textwrap.dedent(
        f"""
        import tensorflow as tf, zmq_ops
        assert tf.executing_eagerly()
        sock = zmq_ops.ZMQPullSocket({ipc!r}, [tf.uint8, tf.int32], timeout_ms=20000)
        print("ready", flush=True)
        labels = [int(sock.pull()[1][0]) for _ in range(2)]
        ds = zmq_ops.dataset({ipc + "2"!r}, [tf.uint8, tf.int32], timeout_ms=20000)
        print("ready", flush=True)
        labels += [int(lb[0]) for _, lb in ds.take(2)]
        print(labels)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        senders.append(Sender(ipc, "native", count=2))
        assert proc.stdout.readline().strip() == "ready"
        senders.append(Sender(ipc + "2", "zmq_ops", count=2, first=10))
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert out.strip() == "[0, 1, 10, 11]"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- tensorpack, unchanged


TENSORPACK_SENDER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from tensorpack.dataflow import DataFromList
    from tensorpack.dataflow.remote import send_dataflow_zmq
    points = [[np.full((3, 5), i, np.float32), np.array(i, np.int64)] for i in range(8)]
    send_dataflow_zmq(DataFromList(points, shuffle=False), sys.argv[1], hwm=4, format="zmq_ops")
    """
)


@pytest.mark.timeout(180)
def test_tensorpack_zmq_input_with_send_dataflow_zmq(ipc: str) -> None:
    """tensorpack's sender (which imports our dump_arrays) feeds tensorpack's ZMQInput (which builds our op)."""
    from tensorpack.input_source import ZMQInput

    graph = tf.Graph()
    with graph.as_default():
        inp = ZMQInput(ipc, hwm=4, bind=True)
        inp.setup([tf.TensorSpec([3, 5], tf.float32, "x"), tf.TensorSpec([], tf.int64, "y")])
        x, y = inp.get_input_tensors()
        assert x.shape.as_list() == [3, 5]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sender = subprocess.Popen(
        [sys.executable, "-c", TENSORPACK_SENDER, ipc], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    # ZMQInput waits forever; a step deadline cancels the pull if the sender broke.
    options = tf.compat.v1.RunOptions(timeout_in_ms=60_000)
    try:
        with tf.compat.v1.Session(graph=graph) as sess:
            try:
                got = [sess.run([x, y], options=options) for _ in range(10)]  # the dataflow loops forever
            except tf.errors.DeadlineExceededError:
                sender.kill()
                pytest.fail(f"no data from send_dataflow_zmq: {sender.communicate()[1][-2000:]}")
        for i, (xv, yv) in enumerate(got):
            assert xv.dtype == np.float32 and (xv == i % 8).all()
            assert yv == i % 8
    finally:
        sender.kill()
        sender.wait()
        sender.stderr.close()


# ---------------------------------------------------------------- build and import


def test_build_is_incremental_and_stamped() -> None:
    from zmq_ops import build

    assert build.up_to_date()
    started = time.monotonic()
    assert build.build(verbose=False) == build.library_path()
    assert time.monotonic() - started < 30  # nothing was compiled (a generous bound, not a benchmark)
    assert build.built_stamp() == f"tf={tf.__version__}"


def test_build_without_libzmq_headers_says_how_to_install(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from zmq_ops import build

    monkeypatch.setattr(build, "ZMQ_HEADER", Path("/nonexistent/zmq.h"))
    monkeypatch.setattr(build.shutil, "which", lambda name: None if name == "pkg-config" else "/usr/bin/" + name)
    assert build.main(["--force"]) == 1
    err = capsys.readouterr().err
    assert "libzmq headers not found: install them with `sudo apt-get install libzmq3-dev`" in err
    assert "Traceback" not in err
    assert build.up_to_date()  # the real library was left alone


def test_import_without_the_library_says_to_run_make_op(tmp_path: Path) -> None:
    pkg = tmp_path / "zmq_ops"
    pkg.mkdir()
    for name in ("__init__.py", "build.py", "tf_op.py"):
        shutil.copy(ROOT / "zmq_ops" / name, pkg / name)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run(
        [sys.executable, "-c", "import zmq_ops; zmq_ops.ZMQPullSocket"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "make op" in proc.stderr


@pytest.mark.timeout(120)
def test_empty_tensor_with_huge_dimensions_is_rejected_cleanly(
    ipc: str, push: zmq.Context, graphs: list[Graph]
) -> None:
    """[0, 2**62, 2**62] holds no bytes, but TensorFlow cannot represent the shape: InvalidArgument, no abort."""
    import struct

    g = Graph(ipc, [tf.uint8])
    graphs.append(g)
    s = connect_push(push, ipc)
    shape = [0, 2**62, 2**62]
    header = struct.pack("<4sHHIQqI", b"FBWN", 1, 1, 0, 0, 0, 0) + struct.pack("<ii3q", 4, 3, *shape)
    s.send_multipart([header, b""])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor\[0\]\.shape"):
        g.run()
    message.send(s, [np.arange(3, dtype=np.uint8)], fmt="native")
    assert g.run()[0].tolist() == [0, 1, 2]
