"""The TF-free native receiver: real producer processes fill numpy slots, exactly and checked."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zmq

from producers.synthetic import SyntheticSource
from wire import message
from zmq_ops import build
from zmq_ops.receiver import BatchError, Receiver, ReceiveTimeout

ROOT = Path(__file__).resolve().parent.parent
BATCH, SIZE = 4, 16
SPECS = [("uint8", (BATCH, SIZE, SIZE, 3)), ("int32", (BATCH,))]
TIMEOUT_MS = 20_000  # only ever reached when something is broken


def slots(n: int = 3) -> list[list[np.ndarray]]:
    return [[np.zeros(shape, dtype) for dtype, shape in SPECS] for _ in range(n)]


def small(*extra: str) -> tuple[str, ...]:
    return ("--batch", str(BATCH), "--image-size", str(SIZE), *extra)


@pytest.mark.timeout(120)
def test_two_producers_fill_the_slots_exactly(procs, ipc_dir) -> None:
    ep = f"ipc://{ipc_dir}/r"
    ring = slots()
    pools = []
    for worker in range(2):
        gen = SyntheticSource(batch=BATCH, image_size=SIZE)(worker)
        pools.append([next(gen) for _ in range(SyntheticSource.pool)])
    with Receiver(ep, SPECS, ring, timeout_ms=TIMEOUT_MS) as r:
        procs.producer(ep, *small("--workers", "2", "--count", "200"))
        for _ in range(200):
            i = r.next()
            images, labels = ring[i]
            assert any(
                np.array_equal(images, im) and np.array_equal(labels, lb) for pool in pools for im, lb in pool
            ), "a slot holds bytes no producer sent"
            r.release(i)
        rows, messages, nbytes = r.stats()
        assert rows == [(0, 100, 0, 0, 0), (1, 100, 0, 0, 0)]
        assert messages == 200 and nbytes > 200 * BATCH * SIZE * SIZE * 3
        with pytest.raises(ReceiveTimeout, match=re.escape(ep)):
            r.next(timeout_ms=300)


@pytest.mark.timeout(60)
def test_mismatched_and_malformed_batches_name_the_field_and_the_receiver_goes_on(ipc_dir) -> None:
    ep = f"ipc://{ipc_dir}/r"
    ring = slots(2)
    ctx = zmq.Context()
    try:
        with Receiver(ep, SPECS, ring, timeout_ms=TIMEOUT_MS) as r:
            push = ctx.socket(zmq.PUSH)
            push.connect(ep)
            wrong = [np.zeros((BATCH, SIZE, SIZE, 1), np.uint8), np.zeros(BATCH, np.int32)]
            message.send(push, wrong, producer_id=3, seq=0)
            with pytest.raises(BatchError, match=r"tensor\[0\]\.shape.*\[4, 16, 16, 1\].*\[4, 16, 16, 3\]"):
                r.next()
            message.send(push, [np.zeros(BATCH, np.int32)], producer_id=3, seq=1)
            with pytest.raises(BatchError, match=r"n_tensors.* 1 tensors.*expects 2"):
                r.next()
            message.send(push, [np.zeros(SPECS[0][1], np.float32), np.zeros(BATCH, np.int32)], producer_id=3, seq=2)
            with pytest.raises(BatchError, match=r"tensor\[0\]\.dtype.*float32.*uint8"):
                r.next()
            push.send_multipart([b"FBWN" + b"\0" * 10, b"x"])
            with pytest.raises(BatchError, match=r"bad native message from .*header"):
                r.next()
            good = [np.full(SPECS[0][1], 7, np.uint8), np.arange(BATCH, dtype=np.int32)]
            message.send(push, good, producer_id=3, seq=3)
            i = r.next()
            assert (ring[i][0] == 7).all() and list(ring[i][1]) == [0, 1, 2, 3]
            r.release(i)
            with pytest.raises(ValueError, match="slot .* is not held"):
                r.release(i)
            push.close(0)
    finally:
        ctx.destroy(0)


def test_bad_buffers_and_endpoints_are_refused_with_one_line(ipc_dir) -> None:
    ep = f"ipc://{ipc_dir}/r"
    ring = slots(1)
    ring[0][0] = np.zeros((BATCH, SIZE, SIZE, 2), np.uint8)
    with pytest.raises(ValueError, match=r"slots\[0\]\[0\]: buffer holds 2048 bytes, the field needs 3072"):
        Receiver(ep, SPECS, ring)
    with pytest.raises(ValueError, match="slots\\[0\\] has 1 buffers for 2 specs"):
        Receiver(ep, SPECS, [[np.zeros(10)]])
    with pytest.raises(ValueError, match="binding to a non-loopback address"):
        Receiver("tcp://0.0.0.0:5999", SPECS, slots(1))
    with pytest.raises(ValueError, match="curve-keys .*server.key_secret is missing"):
        Receiver(ep, SPECS, slots(1), curve_keys=ipc_dir)


def test_importing_the_receiver_imports_neither_tensorflow_nor_torch() -> None:
    code = (
        "import sys, zmq_ops, zmq_ops.receiver; "
        "bad = [m for m in ('tensorflow', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_compat_header_agrees_with_libzmq() -> None:
    system = Path("/usr/include/zmq.h")
    if not system.exists():
        pytest.skip("no libzmq headers to compare with")
    define = re.compile(r"^#define (\w+) (.+?)\s*$", re.M)
    ours = dict(define.findall((ROOT / "zmq_ops" / "src" / "compat" / "zmq.h").read_text()))
    theirs = dict(define.findall(system.read_text()))
    for name, value in ours.items():
        if name.startswith("FEEDBENCH"):
            continue
        assert theirs.get(name) == value, name


@pytest.mark.timeout(300)
def test_builds_and_receives_against_the_libzmq_bundled_with_pyzmq(procs, ipc_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(build, "ZMQ_HEADER", Path("/nonexistent/zmq.h"))
    monkeypatch.setattr(build, "RECEIVER", tmp_path / "libfeedbench_receiver.so")
    lib = build.build_receiver(force=True, verbose=False)
    needed = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    assert "pyzmq.libs" in needed
    ep = f"ipc://{ipc_dir}/r"
    procs.producer(ep, *small("--count", "5"))
    code = textwrap.dedent(f"""
        import ctypes, numpy as np
        import zmq_ops.receiver as R
        R._LIB = R.bind(ctypes.CDLL({str(lib)!r}))
        ring = [[np.zeros(s, d) for d, s in {SPECS!r}] for _ in range(2)]
        with R.Receiver({ep!r}, {SPECS!r}, ring, timeout_ms={TIMEOUT_MS}) as r:
            for _ in range(5):
                r.release(r.next())
            assert r.stats()[0] == [(0, 5, 0, 0, 0)], r.stats()
    """)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


@pytest.mark.timeout(60)
def test_next_waits_with_the_gil_released(ipc_dir) -> None:
    import threading

    with Receiver(f"ipc://{ipc_dir}/r", SPECS, slots(1)) as r:
        done = threading.Event()
        ticks = 0

        def wait() -> None:
            with pytest.raises(ReceiveTimeout):
                r.next(timeout_ms=1000)
            done.set()

        t = threading.Thread(target=wait)
        t.start()
        while not done.is_set():
            ticks += 1  # runs only while next() does not hold the GIL
        t.join()
    assert ticks > 10_000


@pytest.mark.timeout(120)
def test_closing_removes_the_ipc_file_it_bound_and_never_a_live_one(procs, ipc_dir) -> None:
    path = Path(ipc_dir) / "r"
    ep = f"ipc://{path}"
    with Receiver(ep, SPECS, slots(), timeout_ms=TIMEOUT_MS) as r:
        procs.producer(ep, *small("--count", "3"))
        for _ in range(3):
            r.release(r.next())
        assert path.is_socket()
        with pytest.raises(ValueError, match="address already in use"):  # a second consumer: refused
            Receiver(ep, SPECS, slots())
        assert path.is_socket()  # the refused one removed nothing: the first still serves it
    assert not path.exists()
