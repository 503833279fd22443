"""shm:// endpoints: batches in producers' shared-memory slots, slot messages over ZMQ.

Real producer processes feed the native receiver, the TensorFlow op and the
Python pull consumer; faults (a producer or consumer killed, signals) must
leave nothing in /dev/shm, and malformed slot messages are rejected by name.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq
from conftest import ShmLeaks, descendants, private_dir, regions_held_by
from path_lists import producer_paths

from consumers.zmq_pull import PullConsumer
from producers.synthetic import SyntheticSource
from wire import shm
from wire.endpoints import EndpointError
from wire.errors import WireError
from zmq_ops.receiver import BatchError, Receiver, ReceiveTimeout

ROOT = Path(__file__).resolve().parent.parent
BATCH, SIZE = 2, 4
SPECS = [("uint8", (BATCH, SIZE, SIZE, 3)), ("int32", (BATCH,))]
SMALL = ("--batch", str(BATCH), "--image-size", str(SIZE))
TIMEOUT_MS = 30_000  # only ever reached when something is broken


def sockets() -> set[str]:
    """Bound shm:// slot-message sockets (abstract: /proc/net/unix) and any socket file in the private folder."""
    prefix = f"@feedbench-{os.getuid()}/"
    bound = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        path = line.split()[-1] if len(line.split()) >= 8 else ""
        if path.startswith(prefix) and path.endswith(".sock"):
            bound.add(path[len(prefix) :])
    return bound | {p.name for p in private_dir().glob("*.sock")}


def handover_sockets() -> set[str]:
    prefix = f"@feedbench-{os.getuid()}/"
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {ln.split()[-1][len(prefix) :] for ln in lines if ln.split()[-1].startswith(prefix) and ln.endswith(".fd")}


def ring(n: int = 3) -> list[list[np.ndarray]]:
    return [[np.zeros(s, d) for d, s in SPECS] for _ in range(n)]


def pool_of(worker: int, batch: int = BATCH, size: int = SIZE) -> list[tuple[np.ndarray, np.ndarray]]:
    gen = SyntheticSource(batch=batch, image_size=size)(worker)
    return [next(gen) for _ in range(SyntheticSource.pool)]


# ---------------------------------------------------------------- delivery


@pytest.mark.timeout(300)
def test_four_producers_times_a_thousand_batches_arrive_exactly_once(procs, ep) -> None:
    pools = [pool_of(i) for i in range(4)]
    slots = ring(4)
    with Receiver(ep, SPECS, slots, hwm=8, timeout_ms=TIMEOUT_MS) as r:
        ps = [procs.producer(ep, *SMALL, "--count", "1000", "--producer-id", str(i)) for i in range(4)]
        for _ in range(4000):
            i = r.next()
            images, labels = slots[i]
            assert any(np.array_equal(images, a) and np.array_equal(labels, b) for p in pools for a, b in p)
            r.release(i)
        with pytest.raises(ReceiveTimeout):
            r.next(timeout_ms=500)  # and not one more
        rows, messages, nbytes = r.stats()
    assert rows == [(i, 1000, 0, 0, 0) for i in range(4)]
    assert messages == 4000 and nbytes == 4000 * sum(np.zeros(s, d).nbytes for d, s in SPECS)
    for p in ps:
        assert p.wait(60) == 0


@pytest.mark.timeout(120)
def test_python_consumer_reads_slots_with_one_copy_each(procs, ep) -> None:
    pool = pool_of(0)
    with PullConsumer(ep, recv_timeout=30) as c:
        p = procs.producer(ep, *SMALL, "--count", "50")
        batches = [c.recv() for _ in range(50)]
    for k, b in enumerate(batches):
        assert b.header.seq == k
        np.testing.assert_array_equal(b.arrays[0], pool[k % len(pool)][0])
        assert b.arrays[0].flags.owndata  # copied out: the slot is already back with the producer
    assert c.tracker.table()[0]["received"] == 50
    assert p.wait(60) == 0


@pytest.mark.timeout(180)
def test_the_op_reads_slots(procs, ep) -> None:
    tf_op = pytest.importorskip("zmq_ops.tf_op", reason="zmq_ops op not built (run `make op`)")
    tf = tf_op.tf
    pool = pool_of(0)
    graph = tf.Graph()
    with graph.as_default():
        sock = tf_op.ZMQPullSocket(ep, [tf.uint8, tf.int32], timeout_ms=TIMEOUT_MS)
        pulled, stats = sock.pull(), sock.stats()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(sock.handle)
        p = procs.producer(ep, *SMALL, "--count", "20")
        for k in range(20):
            images, labels = sess.run(pulled)
            np.testing.assert_array_equal(images, pool[k % len(pool)][0])
            np.testing.assert_array_equal(labels, pool[k % len(pool)][1])
        rows, _ = sess.run(stats)
        assert rows.tolist() == [[0, 20, 0, 0, 0]]
    del sess, sock, pulled, stats, graph  # closes the connection (and its socket file)
    assert p.wait(60) == 0


def test_regions_are_anonymous_sealed_and_unguessable() -> None:
    """No name in /dev/shm (nothing there to leak), a size nobody can change, a label nobody can guess."""
    import fcntl

    r = shm.Region(2, 4096)
    try:
        assert not (shm.SHM_DIR / r.name[1:]).exists()
        assert r.name in regions_held_by(os.getpid())
        assert fcntl.fcntl(r._fd, fcntl.F_GET_SEALS) & shm.SEALS == shm.SEALS
        with pytest.raises(OSError):
            os.ftruncate(r._fd, 4096)
        assert re.fullmatch(rf"/fb-{os.getpid()}-[0-9a-f]{{32}}", r.name)
        other = shm.Region(1, 4096)
        other.close()
        assert other.name != r.name
    finally:
        r.close()
    assert r.name not in regions_held_by(os.getpid())


def test_bad_shm_names_are_one_line(procs) -> None:
    p = procs.producer("shm://a/b", *SMALL)
    assert p.wait(30) != 0
    assert "NAME must be 1-64 characters" in p.stderr.read()
    with pytest.raises(ValueError, match="NAME must be"):
        Receiver("shm://" + "x" * 65, SPECS, ring(1))
    p = procs.producer("shm://ok-name", *SMALL, "--wire-format", "zmq_ops")
    assert p.wait(30) != 0
    assert "native format only" in p.stderr.read()


# ---------------------------------------------------------------- faults


@pytest.mark.timeout(120)
def test_a_producer_killed_mid_stream_publishes_no_partial_batch_and_leaves_no_region(procs, ep) -> None:
    big = ("--batch", "16", "--image-size", "64")  # writes long enough for kills to land mid-copy
    pool = pool_of(0, 16, 64)
    specs = [("uint8", (16, 64, 64, 3)), ("int32", (16,))]
    slots = [[np.zeros(s, d) for d, s in specs] for _ in range(2)]
    with Receiver(ep, specs, slots, timeout_ms=TIMEOUT_MS) as r:
        for _ in range(3):
            p = procs.producer(ep, *big)
            i = r.next()
            r.release(i)
            (worker,) = psutil.Process(p.pid).children()  # the producer's one worker
            worker.send_signal(signal.SIGKILL)
            assert p.wait(30) != 0
            while True:  # everything published before the kill is whole
                try:
                    i = r.next(timeout_ms=300)
                except ReceiveTimeout:
                    break
                except BatchError as e:  # a slot message whose region went with its producer
                    assert "slot.region" in str(e)
                    continue
                assert any(np.array_equal(slots[i][0], a) for a, _ in pool)
                r.release(i)


@pytest.mark.timeout(120)
def test_a_killed_consumer_stops_its_producers_and_leaves_no_region(procs, ep) -> None:
    code = textwrap.dedent(f"""
        import numpy as np, sys
        from zmq_ops.receiver import Receiver
        ring = [[np.zeros(s, d) for d, s in {SPECS!r}] for _ in range(2)]
        r = Receiver({ep!r}, {SPECS!r}, ring, timeout_ms={TIMEOUT_MS})
        while len(r.producers()) < 2:  # a batch from each worker: both give-up timers are armed
            r.release(r.next())
        print("ready", flush=True)
        sys.stdin.read()
    """)
    consumer = procs.start("-c", code, stdin=subprocess.PIPE)
    p = procs.producer(ep, *SMALL, "--workers", "2", "--give-up-after", "2")
    assert consumer.stdout.readline().strip() == "ready"
    workers = descendants(p.pid)
    os.kill(consumer.pid, signal.SIGKILL)
    consumer.wait(10)
    assert p.wait(60) == 3
    assert "no consumer took a batch" in p.stderr.read()
    assert not psutil.wait_procs(workers, timeout=10)[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_remove_the_regions_whether_or_not_a_consumer_mapped_them(procs, ep, sig) -> None:
    # No consumer: the producer has created its region and waits to send.
    p = procs.producer(ep, *SMALL, "--workers", "2")
    deadline = time.monotonic() + 30
    pids = {w.pid for w in descendants(p.pid)}
    while not any(regions_held_by(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = {w.pid for w in descendants(p.pid)}
    assert any(regions_held_by(pid) for pid in pids), "the producer made no region"
    os.killpg(p.pid, sig) if sig == signal.SIGINT else p.send_signal(sig)
    assert p.wait(30) == 0
    assert not any(regions_held_by(pid) for pid in pids)


@pytest.mark.timeout(120)
def test_a_worker_killed_before_any_consumer_mapped_its_region_is_cleaned_up_by_the_launcher(procs, ep) -> None:
    p = procs.producer(ep, *SMALL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        workers = [w for w in descendants(p.pid) if regions_held_by(w.pid)]
        if workers:
            break
        time.sleep(0.05)
    (worker,) = workers
    worker.send_signal(signal.SIGKILL)
    assert p.wait(30) != 0
    assert not regions_held_by(worker.pid)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("consumer", [False, True])
def test_sigkill_of_every_process_leaves_nothing_in_dev_shm_or_the_socket_folder(procs, consumer) -> None:
    """Producers (launcher and workers) and the consumer all killed at once, before or after it mapped the regions."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    ep = f"shm://{name}"
    leaks = ShmLeaks(name)  # what this test's processes make; a parallel test's live producers are not ours
    family: list[psutil.Process] = []
    if consumer:
        code = textwrap.dedent(f"""
            import numpy as np, sys
            from zmq_ops.receiver import Receiver
            ring = [[np.zeros(s, d) for d, s in {SPECS!r}] for _ in range(2)]
            r = Receiver({ep!r}, {SPECS!r}, ring, timeout_ms={TIMEOUT_MS})
            while len(r.producers()) < 2:  # both workers' regions are mapped
                r.release(r.next())
            print("ready", flush=True)
            sys.stdin.read()
        """)
        c = procs.start("-c", code, stdin=subprocess.PIPE)
        family.append(psutil.Process(c.pid))
    p = procs.producer(ep, *SMALL, "--workers", "2")
    if consumer:
        assert c.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    workers: list[psutil.Process] = []
    while time.monotonic() < deadline and len(workers) < 2:
        workers = [w for w in descendants(p.pid) if regions_held_by(w.pid)]
        time.sleep(0.05)
    assert len(workers) == 2, "the producer's workers made no regions"
    family += [psutil.Process(p.pid), *descendants(p.pid)]
    for q in family:
        q.kill()
    assert not psutil.wait_procs(family, timeout=30)[1]
    assert leaks.left() == (set(), set())
    deadline = time.monotonic() + 10  # the kernel drops a dead process's sockets as it reaps it
    while time.monotonic() < deadline and (f"{name}.sock" in sockets() or f"{name}.fd" in handover_sockets()):
        time.sleep(0.1)
    assert f"{name}.sock" not in sockets() and f"{name}.fd" not in handover_sockets()


@pytest.mark.timeout(60)
def test_a_region_from_another_process_or_never_handed_over_is_refused(ep) -> None:
    """A slot message can only name a region its own producer handed over on the consumer's socket."""
    with PullConsumer(ep, recv_timeout=30) as c, Sender(ep) as s:
        s.send(s.frames(0))
        c.recv()
        stranger = shm.Region(4, s.region.slot_size)  # a real region, never handed over
        try:
            offsets = stranger.write(0, s.arrays)
            stranger.publish(0)
            s.send(shm.encode(s.arrays, 0, 9, stranger.name, 0, offsets))
            with pytest.raises(WireError, match=r"slot\.region: .* was never handed over"):
                c.recv()
        finally:
            stranger.close()


# ---------------------------------------------------------------- malformed slot messages


class Sender:
    """An in-test producer: a real region and a PUSH socket, sending crafted slot messages."""

    def __init__(self, ep: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.connect(shm.zmq_endpoint(ep))
        self.arrays = [np.arange(np.prod(s), dtype=d).reshape(s).astype(d) for d, s in SPECS]
        self.region = shm.Region(4, shm.layout(self.arrays)[1])
        assert self.region.hand_over(ep)
        self.seq = 0

    def frames(self, slot: int = 0) -> list[bytes]:
        offsets = self.region.write(slot, self.arrays)
        self.region.publish(slot)
        self.seq += 1
        return shm.encode(self.arrays, 0, self.seq - 1, self.region.name, slot, offsets)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
        self.region.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def desc(region: str, slot: int, offsets: list[int], magic: bytes = b"FBSL") -> bytes:
    name = region.encode()
    return struct.pack("<4sIH", magic, slot, len(name)) + name + struct.pack(f"<{len(offsets)}Q", *offsets)


CASES = [
    ("slot.index", lambda s, h: [h, desc(s.region.name, 4, [0, 4096 - 64])]),
    ("slot.index", lambda s, h: [h, desc(s.region.name, 2**32 - 1, [0, 0])]),
    ("tensor[0].offset", lambda s, h: [h, desc(s.region.name, 0, [2**64 - 8, 0])]),
    ("tensor[1].offset", lambda s, h: [h, desc(s.region.name, 0, [0, 4090])]),
    ("slot.region", lambda s, h: [h, desc("/fb-1-" + "0" * 32, 0, [0, 128])]),
    ("slot.region", lambda s, h: [h, desc("/../etc/passwd", 0, [0, 128])]),
    ("slot.magic", lambda s, h: [h, desc(s.region.name, 0, [0, 128], b"XXXX")]),
    ("slot.length", lambda s, h: [h, desc(s.region.name, 0, [0])]),
    ("slot.state", lambda s, h: [h, desc(s.region.name, 3, [0, 128])]),  # never published
    ("frames", lambda s, h: [h]),
    ("header", lambda s, h: [h[:8], desc(s.region.name, 0, [0, 128])]),
    ("version", lambda s, h: [h[:4] + b"\x07\x00" + h[6:], desc(s.region.name, 0, [0, 128])]),
]


@pytest.mark.timeout(120)
def test_malformed_slot_messages_are_rejected_by_field_in_the_receiver(ep) -> None:
    slots = ring(2)
    with Receiver(ep, SPECS, slots, timeout_ms=TIMEOUT_MS) as r, Sender(ep) as s:
        s.send(s.frames(0))  # a good one first: the region is now mapped
        r.release(r.next())
        for field, make in CASES:
            header = s.frames(0)[0]
            s.region._state[0] = shm.FREE  # crafted messages below never claim slot 0
            s.send(make(s, header))
            with pytest.raises(BatchError, match=re.escape(field) + ":"):
                r.next()
        s.send(s.frames(1))
        i = r.next()
        np.testing.assert_array_equal(slots[i][0], s.arrays[0])
        r.release(i)


@pytest.mark.timeout(120)
def test_refused_slot_messages_add_no_bytes_to_the_byte_total(ep) -> None:
    """A slot message declares its bytes in its header; only a slot that was read delivered them. Three
    refused ones declaring 2^62 bytes each, then one good batch: the total is that batch's bytes (it read
    -4.6e18, then 2^63 - 1, when declared sizes were counted before the slot was read)."""
    huge = np.broadcast_to(np.zeros(1, np.uint8), (2**62,))  # a shape, no memory
    with Receiver(ep, SPECS, ring(2), timeout_ms=TIMEOUT_MS) as r, Sender(ep) as s:
        for _ in range(3):
            s.send(shm.encode([huge, s.arrays[1]], 0, 0, s.region.name, 0, [0, 128]))
        s.send(s.frames(1))
        while True:  # the refusals come as one error or more (counted together as they arrive)
            try:
                r.release(r.next())
                break
            except BatchError as e:
                assert "tensor[0].offset: 0 + 4611686018427387904 bytes overrun" in str(e), e
        while r.bad_messages() < 3 or r.stats()[1] < 4:  # the receive threads may count a refusal after the batch
            time.sleep(0.01)
        assert r.bad_messages() == 3
        _, messages, nbytes = r.stats()
        assert messages == 4 and nbytes == sum(a.nbytes for a in s.arrays), (messages, nbytes)


@pytest.mark.timeout(120)
def test_malformed_slot_messages_are_rejected_by_field_in_python(ep) -> None:
    with PullConsumer(ep, recv_timeout=30) as c, Sender(ep) as s:
        s.send(s.frames(0))
        c.recv()
        for field, make in CASES:
            header = s.frames(0)[0]
            s.region._state[0] = shm.FREE
            s.send(make(s, header))
            with pytest.raises(WireError, match=re.escape(field) + ":"):
                c.recv()


@pytest.mark.timeout(300)
def test_fuzzed_slot_messages_never_crash_or_read_outside_the_region(ep) -> None:
    """Random mutations of good slot messages: each is a whole batch or a named rejection."""
    rng = random.Random(16)
    slots = ring(2)
    accepted = rejected = 0
    with Receiver(ep, SPECS, slots, timeout_ms=TIMEOUT_MS) as r, Sender(ep) as s:
        for _ in range(1500):
            frames = [bytearray(f) for f in s.frames(rng.randrange(4))]
            for _ in range(rng.randint(1, 4)):
                f = frames[rng.randrange(len(frames))]
                op = rng.random()
                if op < 0.5 and f:
                    f[rng.randrange(len(f))] = rng.randrange(256)
                elif op < 0.7 and f:
                    del f[rng.randrange(len(f)) :]
                elif op < 0.85:
                    at = rng.randrange(len(f) + 1)
                    f[at:at] = rng.randbytes(rng.randint(1, 16))
                elif len(f) >= 8:
                    at = rng.randrange(len(f) - 7)
                    f[at : at + 8] = struct.pack("<Q", rng.choice([0, 2**63, 2**64 - 1, 4096, rng.getrandbits(64)]))
            s.send([bytes(f) for f in frames])
            try:
                i = r.next()
                accepted += 1
                r.release(i)
            except BatchError as e:
                rejected += 1
                assert re.search(r"(\w+(\[\d+\])?(\.\w+)*(\[\d+\])?): ", str(e)), str(e)
            for k in range(4):  # whatever happened, give every slot back to the in-test producer
                s.region._state[k] = shm.FREE
    assert accepted + rejected == 1500 and rejected > 1000


def test_importing_wire_shm_needs_no_framework() -> None:
    code = "import sys, wire.shm; assert 'tensorflow' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.timeout(300)
# The native op and a Python consumer: the two readers of shm:// slots.
@pytest.mark.parametrize("path", ["zmq-consume", "python-queue"])
def test_bench_input_reads_an_external_shm_producer(procs, ep, tmp_path, path) -> None:
    producer = procs.producer(ep, "--batch", "2", "--image-size", "32", "--producer-id", "7")
    out_json = tmp_path / "r.json"
    p = procs.start(
        "bench_input.py", "--fake-location", path, "--input-only", "--endpoint", ep, "--batch", "2",
        "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2", "--json", str(out_json),
    )  # fmt: skip
    _, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    doc = json.loads(out_json.read_text())
    row = doc["paths"][path]
    assert row["images_per_sec"]["median"] > 0
    assert [r["producer"] for r in row["producers"]] == [7]
    assert row["producers"][0]["lost"] == 0 and row["producers"][0]["received"] > 0
    producer.terminate()
    assert producer.wait(30) == 0


@pytest.mark.timeout(300)
def test_an_interrupted_run_on_an_external_shm_endpoint_removes_its_socket_file(procs, ep) -> None:
    """A signal skips the op's own clean-up; the run's shutdown clean-up removes the file instead."""
    # 2000 steps: the gpu baseline's are quick; the producer's --rate keeps the path under test busy.
    producer = procs.producer(ep, "--batch", "2", "--image-size", "32", "--rate", "20")
    p = procs.start(
        "bench_input.py", "--fake-location", "zmq-consume", "--input-only", "--endpoint", ep, "--batch", "2",
        "--image-size", "32", "--warmup-steps", "1", "--steps", "2000", "--repeats", "1",
    )  # fmt: skip
    name = f"{shm.check_name(ep)}.sock"
    deadline = time.monotonic() + 240
    while name not in sockets() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert name in sockets(), p.stderr.read() if p.poll() is not None else "the run never bound its endpoint"
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 128 + signal.SIGTERM
    assert name not in sockets()
    producer.terminate()
    assert producer.wait(30) == 0


def test_the_synthetic_source_writes_every_batch_into_the_slot_it_is_handed() -> None:
    """Over shm:// the synthetic producer writes each batch anew into its slot, the same bytes as its pool."""
    plain = SyntheticSource(batch=4, image_size=8)(0)
    pool = [next(plain) for _ in range(6)]
    handed: list[list[np.ndarray]] = []

    def buffers() -> list[np.ndarray]:
        handed.append([np.full((4, 8, 8, 3), 7, np.uint8), np.full(4, -1, np.int32)])
        return handed[-1]

    filled = SyntheticSource(batch=4, image_size=8)(0, buffers=buffers)
    for i in range(6):
        images, labels = next(filled)
        assert images is handed[i][0] and labels is handed[i][1]  # written into the slot, not a pool array
        np.testing.assert_array_equal(images, pool[i][0])
        np.testing.assert_array_equal(labels, pool[i][1])
    assert not (pool[0][0] == pool[1][0]).all(), "the pool's batches differ"


def test_a_slot_that_already_holds_the_same_read_only_arrays_is_rewritten_unless_reuse_is_asked() -> None:
    pool = [np.arange(96, dtype=np.uint8).reshape(2, 4, 4, 3).copy(), np.arange(2, dtype=np.int32)]
    for a in pool:
        a.flags.writeable = False
    honest = shm.Region(2, shm.layout(pool)[1])  # the default: every batch written anew
    try:
        honest.write(0, pool)
        honest._data[0] = 255
        honest.write(0, pool)
        assert honest._data[0] == 0
    finally:
        honest.close()
    r = shm.Region(2, shm.layout(pool)[1], reuse=True)
    try:
        r.write(0, pool)
        r._data[0] = 255  # stands in for "bytes the second write would have to restore"
        r.write(0, pool)
        assert r._data[0] == 255  # same read-only arrays: nothing copied
        writable = [a.copy() for a in pool]
        r.write(0, writable)
        assert r._data[0] == 0  # other arrays: copied
        r._data[0] = 255
        r.write(0, writable)
        assert r._data[0] == 0  # writable arrays are always copied
    finally:
        r.close()


@pytest.mark.timeout(180)
def test_decode_producers_decode_straight_into_the_slots_and_match_ipc(procs, ep, ipc_dir, tmp_path) -> None:
    data = tmp_path / "ds"
    made = procs.start("-m", "producers", "make-dataset", str(data), "--classes", "2", "--per-class", "4")
    assert made.wait(120) == 0
    args = ("--data", str(data), "--batch", "4", "--image-size", "32", "--count", "6", "--quiet", "--hwm", "2")
    got = {}
    for endpoint in (f"ipc://{ipc_dir}/d", ep):
        with PullConsumer(endpoint, recv_timeout=60) as c:
            p = procs.start("-m", "producers", "decode", "--endpoint", endpoint, *args)
            got[endpoint] = [c.recv().arrays for _ in range(6)]
        assert p.wait(60) == 0, p.stderr.read()
    for (a_images, a_labels), (b_images, b_labels) in zip(*got.values(), strict=True):
        np.testing.assert_array_equal(a_images, b_images)
        np.testing.assert_array_equal(a_labels, b_labels)
    assert got[ep][0][0].std() > 5  # decoded pictures, not an untouched slot


@pytest.mark.timeout(300)
def test_the_runs_own_producers_over_shm_feed_every_producer_path_and_leave_nothing(procs, tmp_path) -> None:
    """`--transport shm`: the producers the run starts write into slots; exact counts, nothing left behind."""
    leaks = ShmLeaks()
    out_json = tmp_path / "r.json"
    p = procs.start(
        "bench_input.py", "--transport", "shm", "--input-only", "--num-gpus", "1", "--batch", "2",
        "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2", "--producers", "2",
        "--json", str(out_json),
    )  # fmt: skip
    _, err = p.communicate(timeout=280)
    assert p.returncode == 0, err
    doc = json.loads(out_json.read_text())
    assert doc["config"]["transport"] == "shm"
    for path in producer_paths("tf"):
        rows = doc["paths"][path]["producers"]
        assert rows and {r["producer"] for r in rows} <= {0, 1000}, (path, rows)  # a short run may hear from one
        assert all(r["lost"] == 0 and r["duplicated"] == 0 and r["received"] > 0 for r in rows), (path, rows)
    leaks.assert_none_left()


# ---------------------------------------------------------------- consumers in turn, one at a time, dead producers


def _take(consumer, n: int) -> list[int]:
    """Producer ids of `n` batches from a PullConsumer or a Receiver."""
    if isinstance(consumer, PullConsumer):
        return [consumer.recv().header.producer_id for _ in range(n)]
    ids = []
    for _ in range(n):
        consumer.release(consumer.next())
        ids.append(0)
    return ids


@pytest.mark.timeout(240)
def test_a_producer_serves_each_consumer_in_turn_though_the_last_left_slots_queued(procs, ep) -> None:
    """A consumer that closes with slot messages still queued must not leave the producer's slots taken for ever."""
    p = procs.producer(ep, *SMALL, "--hwm", "4")
    kinds = ["python", "receiver", "python", "receiver"]
    for kind in kinds:
        if kind == "python":
            consumer = PullConsumer(ep, recv_timeout=30)
        else:
            consumer = Receiver(ep, SPECS, ring(2), timeout_ms=TIMEOUT_MS)
        try:
            assert len(_take(consumer, 5)) == 5, kind
            deadline = time.monotonic() + 30  # leave only once the producer has queued more for us
            while time.monotonic() < deadline and not _queued(consumer):
                time.sleep(0.05)
        finally:
            consumer.close()
    assert p.poll() is None, p.stderr.read()
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0


def _queued(consumer) -> bool:
    """True once a batch waits to be read (the producer has published slots we will never take)."""
    if isinstance(consumer, PullConsumer):
        return bool(consumer._sock.poll(0, zmq.POLLIN))
    return True  # the receiver's threads hold slots ahead of the caller as soon as they can


@pytest.mark.timeout(300)
def test_a_second_consumer_of_one_name_is_refused_and_the_first_keeps_its_socket(procs, ep) -> None:
    """As ipc does: a live consumer's NAME cannot be bound again (nor its socket file removed by the loser)."""
    first = PullConsumer(ep, recv_timeout=60)
    try:
        with pytest.raises(EndpointError, match=re.escape(f"endpoint '{ep}': cannot bind: address already in use")):
            PullConsumer(ep)
        with pytest.raises(EndpointError, match="cannot bind: address already in use"):
            Receiver(ep, SPECS, ring(1))
        run = procs.start(
            "bench_input.py", "--fake-location", "python-queue", "--input-only", "--endpoint", ep, "--batch", "2",
            "--image-size", "4", "--warmup-steps", "1", "--steps", "2", "--repeats", "1",
        )  # fmt: skip
        _, err = run.communicate(timeout=240)
        assert run.returncode == 2, err
        assert [ln for ln in err.splitlines() if ln.startswith("error")] == [
            f"error: endpoint '{ep}': cannot bind: address already in use"
        ], err
        p = procs.producer(ep, *SMALL)
        assert first.recv().header.producer_id == 0  # the first consumer still has the stream
    finally:
        first.close()
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0


# One process per producer worker, one after another: each makes a region, sends one slot
# message, waits until it has been taken, and exits (reaped before the next starts).
SHORT_LIVED_PRODUCERS = """
import os, sys, time
import numpy as np
import zmq
from wire import shm

endpoint, n = sys.argv[1], int(sys.argv[2])
arrays = [np.zeros((2, 4, 4, 3), np.uint8), np.zeros(2, np.int32)]
for k in range(n):
    pid = os.fork()
    if pid == 0:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.connect(shm.zmq_endpoint(endpoint))
        region = shm.Region(2, shm.layout(arrays)[1])
        assert region.hand_over(endpoint)
        offsets = region.write(0, arrays)
        region.publish(0)
        sock.send_multipart(shm.encode(arrays, k, 0, region.name, 0, offsets))
        while region._state[0] != shm.FREE:
            time.sleep(0.001)
        sock.close(0)
        ctx.term()
        region.close()
        os._exit(0)
    os.waitpid(pid, 0)
print("done", flush=True)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["python", "receiver"])
def test_a_long_running_consumer_unmaps_the_regions_of_producers_that_are_gone(procs, ep, kind) -> None:
    """More producers than a consumer maps at once (256), one after another: every batch is read."""
    n = 300
    consumer = (
        PullConsumer(ep, recv_timeout=30) if kind == "python" else Receiver(ep, SPECS, ring(2), timeout_ms=TIMEOUT_MS)
    )
    try:
        factory = procs.start("-c", SHORT_LIVED_PRODUCERS, ep, str(n))
        ids = _take(consumer, n)
        assert factory.wait(60) == 0, factory.stderr.read()
        if kind == "python":
            assert sorted(ids) == list(range(n))
            assert len(consumer._slots._regions) <= 1
        else:
            rows, messages, _ = consumer.stats()
            assert messages == n and [r[0] for r in rows] == list(range(n))
    finally:
        consumer.close()


def start_endless_shm_run(procs, tmp: Path, path: str):
    """A `--transport shm` run that trains until stopped: (its process, its run folder, its bound socket names)."""
    p = procs.start(
        "bench_input.py", "--transport", "shm", "--fake-location", path, "--input-only", "--num-gpus", "1",
        "--batch", "2", "--image-size", "4", "--warmup-steps", "1", "--steps", "2000", "--repeats", "1",
        "--producer-rate", "20",  # the gpu baseline's 2000 steps are quick; the path's take minutes
        env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not list(tmp.glob("feedbench-*/producer-*.json")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    (run_dir,) = tmp.glob("feedbench-*")
    ours = [s for s in sockets() if s.startswith(f"{run_dir.name}-")]
    assert ours, "the run bound no shm:// endpoint"
    return p, run_dir, ours


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_shm_run_leaves_no_socket_folder_or_region(procs, ipc_dir, sig) -> None:
    """`--transport shm`: killed or stopped mid-run, nothing of the run is left (as over ipc)."""
    p, run_dir, ours = start_endless_shm_run(procs, Path(ipc_dir), "python-queue")
    family = [psutil.Process(p.pid), *descendants(p.pid)]
    os.kill(p.pid, sig)
    assert p.wait(60) == (128 + sig if sig != signal.SIGKILL else -sig)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (run_dir.exists() or set(ours) & sockets()):
        time.sleep(0.1)
    assert not run_dir.exists(), list(run_dir.iterdir())
    assert not set(ours) & sockets(), "the run's socket file is left"
    assert not psutil.wait_procs(family[1:], timeout=30)[1], "producers outlived the run"
    assert not any(regions_held_by(q.pid) for q in family)


@pytest.mark.timeout(300)
def test_a_whole_shm_run_killed_by_sigkill_leaves_nothing_in_dev_shm_or_the_socket_folder(procs, ipc_dir) -> None:
    """`--transport shm`, the trainer and every producer process SIGKILLed at once, regions mapped and in use."""
    leaks = ShmLeaks()  # what this test's processes make; a parallel test's live producers are not ours
    p, _, ours = start_endless_shm_run(procs, Path(ipc_dir), "zmq-consume")
    deadline = time.monotonic() + 240  # the producers' stats come first; their workers map regions after
    family: list[psutil.Process] = []
    while p.poll() is None and time.monotonic() < deadline:
        family = [psutil.Process(p.pid), *descendants(p.pid)]
        if any(regions_held_by(q.pid) for q in family):
            break
        time.sleep(0.1)
    assert any(regions_held_by(q.pid) for q in family), "no process of the run came to hold a region"
    for q in family:
        q.kill()
    assert not psutil.wait_procs(family, timeout=30)[1]
    assert leaks.left() == (set(), set())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and set(ours) & sockets():
        time.sleep(0.1)
    assert not set(ours) & sockets()


@pytest.mark.timeout(120)
def test_a_worker_killed_is_reported_at_once_and_its_region_removed(procs, ep) -> None:
    """The launcher does not wait for its other workers: one line, its region gone, the producer stops."""
    p = procs.producer(ep, *SMALL, "--workers", "2")
    deadline = time.monotonic() + 60
    workers: list[psutil.Process] = []
    while time.monotonic() < deadline and len(workers) < 2:  # both have made their region (no consumer yet)
        workers = [w for w in descendants(p.pid) if regions_held_by(w.pid)]
        time.sleep(0.05)
    victim = min(workers, key=lambda w: w.create_time())
    victim.send_signal(signal.SIGKILL)
    assert p.wait(30) == 1
    lines = [ln for ln in p.stderr.read().splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and re.fullmatch(r"error: producer worker [01]: killed by SIGKILL", lines[0]), lines
    assert not any(regions_held_by(w.pid) for w in workers)
