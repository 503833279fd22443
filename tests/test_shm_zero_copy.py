"""shm:// zero-copy: the op's outputs and the receiver's arrays are the producers' slots themselves.

Real producer processes write every batch anew with content that names it
(producer id and sequence number), so a slot handed back too early, or a
batch read from the wrong slot, shows as wrong bytes.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zmq_ops.receiver import BatchError, Receiver, ReceiveTimeout

SPECS = [("uint8", (2, 4, 4, 3)), ("int32", (2,))]
TIMEOUT_MS = 30_000  # only ever reached when something is broken

# A producer whose batch k of producer p holds (37 p + k) % 251 in every pixel and labels [p, k].
TAGGED = """
import sys
from pathlib import Path
import numpy as np
from producers import sender

ep, pid, count, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def source(worker):
    k = 0
    while True:
        yield np.full((2, 4, 4, 3), (37 * pid + k) % 251, np.uint8), np.array([pid, k], np.int32)
        k += 1

cfg = sender.SendConfig(endpoint=ep, count=count, producer_id=pid, hwm=4, shm_slots=slots or None)
sys.exit(sender.run(source, 0, cfg))
"""


def tagged(procs, ep: str, pid: int, count: int, slots: int = 0):
    return procs.start("-c", TAGGED, ep, str(pid), str(count), str(slots))


def check(images: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    pid, k = (int(x) for x in labels)
    assert (images == (37 * pid + k) % 251).all(), f"batch {k} of producer {pid} holds other bytes"
    return pid, k


@pytest.mark.timeout(300)
def test_four_producers_times_a_thousand_batches_through_zero_copy_receiver_slots(procs, ep) -> None:
    kept: list[tuple[list[np.ndarray], np.ndarray]] = []  # batches held across many later ones
    seen: dict[int, list[int]] = {p: [] for p in range(4)}
    with Receiver(ep, SPECS, 8, hwm=8, timeout_ms=TIMEOUT_MS, zero_copy=True) as r:
        assert r.zero_copy
        ps = [tagged(procs, ep, p, 1000) for p in range(4)]
        for n in range(4000):
            arrays = r.next_arrays()
            pid, k = check(*arrays)
            seen[pid].append(k)
            if n % 97 == 0:
                kept.append((arrays, arrays[0].copy()))
                if len(kept) > 4:
                    old, copy = kept.pop(0)
                    np.testing.assert_array_equal(old[0], copy)  # untouched by the ~400 batches since
            del arrays
        with pytest.raises(ReceiveTimeout):
            r.next(timeout_ms=500)
        for arrays, copy in kept:
            np.testing.assert_array_equal(arrays[0], copy)
            check(*arrays)
        # Every batch dropped: the receiver keeps its socket while one lives, and producers stay until it hangs up.
        del kept, arrays, copy, old
        rows, messages, _ = r.stats()
    assert {p: sorted(ks) for p, ks in seen.items()} == {p: list(range(1000)) for p in range(4)}
    assert rows == [(p, 1000, 0, 0, 0) for p in range(4)] and messages == 4000
    for p in ps:
        assert p.wait(60) == 0


@pytest.mark.timeout(120)
def test_a_receiver_whose_caller_holds_every_slot_says_so_at_once(procs, ep) -> None:
    with Receiver(ep, SPECS, 2, timeout_ms=TIMEOUT_MS, zero_copy=True) as r:
        p = tagged(procs, ep, 0, 10)
        held = [r.next_arrays(), r.next_arrays()]
        with pytest.raises(BatchError, match="all 2 slots of the receiver for .* are held"):
            r.next_arrays()
        del held
        for _ in range(8):
            check(*r.next_arrays())
    assert p.wait(60) == 0


def _op():
    return pytest.importorskip("zmq_ops.tf_op", reason="zmq_ops op not built (run `make op`)")


EAGER_TESTS = (  # every test below that pulls eagerly: one fresh Python runs them all when one needs it
    "test_four_producers_times_a_thousand_batches_through_the_op_in_place",
    "test_an_op_consumer_holding_every_slot_gets_one_line_not_a_hang",
)


@functools.cache
def eager_run(module: str) -> subprocess.CompletedProcess:
    """One fresh pytest of every test of EAGER_TESTS in `module` (one TensorFlow start-up, not one each)."""
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-k", " or ".join(EAGER_TESTS),
         module],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def ran_in_a_fresh_process(request) -> bool:
    """These tests pull eagerly. In a process where a graph-mode test ran first (v2 behaviour is off for the
    whole process, and cannot be turned back on), run this test in a fresh Python instead; True when it did.

    The first test that needs one starts eager_run for all of EAGER_TESTS; each test then checks its own
    outcome in that run's report.
    """
    if _op().tf.executing_eagerly():
        return False
    r = eager_run(request.node.nodeid.split("::")[0])
    assert f"PASSED {request.node.nodeid}" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
    return True


@pytest.mark.timeout(600)
def test_four_producers_times_a_thousand_batches_through_the_op_in_place(procs, ep, request) -> None:
    """Eager pulls: every output is the slot; tensors kept alive across hundreds of pulls keep their bytes."""
    if ran_in_a_fresh_process(request):
        return
    tf_op = _op()
    tf = tf_op.tf
    sock = tf_op.ZMQPullSocket(ep, [tf.uint8, tf.int32], hwm=8, timeout_ms=TIMEOUT_MS, zero_copy=True)
    assert sock.zero_copy
    ps = [tagged(procs, ep, p, 1000) for p in range(4)]
    seen: dict[int, list[int]] = {p: [] for p in range(4)}
    kept: list[tuple[tf.Tensor, np.ndarray]] = []
    for n in range(4000):
        images, labels = sock.pull()
        pid, k = check(images.numpy(), labels.numpy())
        seen[pid].append(k)
        if n % 97 == 0:
            kept.append((images, images.numpy().copy()))
            if len(kept) > 4:
                old, copy = kept.pop(0)
                np.testing.assert_array_equal(old.numpy(), copy)
    for t, copy in kept:
        np.testing.assert_array_equal(t.numpy(), copy)
    assert {p: sorted(ks) for p, ks in seen.items()} == {p: list(range(1000)) for p in range(4)}
    rows, _ = sock.stats()
    assert rows.numpy().tolist() == [[p, 1000, 0, 0, 0] for p in range(4)]
    del sock, kept, images, labels
    for p in ps:  # an eager connection stays open for the process, so producers wait for it to leave: stop them
        p.terminate()
        p.wait(60)


@pytest.mark.timeout(600)  # may run all of EAGER_TESTS in a fresh process (see ran_in_a_fresh_process)
@pytest.mark.parametrize("zero_copy", [True, False])
def test_an_op_consumer_holding_every_slot_gets_one_line_not_a_hang(procs, ep, zero_copy, request) -> None:
    """Two slots, both held as live tensors: zero-copy says so (copying needs no slot held, so it runs on)."""
    if ran_in_a_fresh_process(request):
        return
    tf_op = _op()
    tf = tf_op.tf
    sock = tf_op.ZMQPullSocket(ep, [tf.uint8, tf.int32], timeout_ms=TIMEOUT_MS, zero_copy=zero_copy)
    assert sock.zero_copy is zero_copy
    p = tagged(procs, ep, 0, 6, slots=2)
    held = [sock.pull(), sock.pull()]
    if zero_copy:
        with pytest.raises(tf.errors.ResourceExhaustedError, match=re.escape("has held all 2 slots")):
            sock.pull()
        del held
    for _ in range(4):
        check(*(t.numpy() for t in sock.pull()))
    del sock
    p.terminate()
    p.wait(60)


class FakeCudart:
    """Stands in for torch.cuda.cudart() on a machine without CUDA: records what would be registered."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 (CUDA's spelling)
        self.calls.append(("register", ptr))
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.calls.append(("unregister", ptr))
        del self.registered[ptr]
        return 0


@pytest.mark.timeout(120)
def test_regions_are_registered_with_cuda_once_and_unregistered_before_they_are_unmapped(procs, ep) -> None:
    """What can be checked without a GPU: each region is registered whole, once, and unregistered in time."""
    from feeders.cuda_slots import cuda_host_register

    cudart = FakeCudart()
    hook = cuda_host_register(cudart)
    r = Receiver(ep, SPECS, 4, timeout_ms=TIMEOUT_MS, zero_copy=True, on_region=hook)
    ps = [tagged(procs, ep, p, 20) for p in range(2)]
    kept = None
    for n in range(40):
        arrays = r.next_arrays()
        check(*arrays)
        assert any(base <= arrays[0].ctypes.data < base + size for base, size in cudart.registered.items())
        if n == 5:
            kept = arrays
    assert len(cudart.registered) == 2 and [c for c, _ in cudart.calls] == ["register", "register"]
    assert all(size % 4096 == 0 for size in cudart.registered.values())
    r.close()  # an array still alive keeps its region mapped (and registered) until it is dropped
    check(*kept)
    assert len(cudart.registered) >= 1
    del kept, arrays
    assert cudart.registered == {} and hook.registered == {}
    assert sorted(c for c, _ in cudart.calls) == ["register"] * 2 + ["unregister"] * 2
    for p in ps:  # all 40 batches were taken; they may still be waiting for us to hang up
        p.terminate()
        p.wait(60)


@pytest.mark.timeout(400)
def test_pytorch_ranks_train_on_tensors_over_the_producers_slots(procs, ep, tmp_path) -> None:
    """--framework torch over shm://: each rank's tensors are the slots (zero_copy), every batch accounted for."""
    import signal

    producer = procs.producer(f"{ep}-r0", "--batch", "2", "--image-size", "4")  # rank 0's endpoint
    r = procs.torch_zmq_consume(ep, tmp_path / "r.json")
    assert r["zero_copy"] is True and r["batches_trained"] == 12
    (row,) = r["producers"]
    assert row["received"] >= 12 and row["lost"] == 0 and row["duplicated"] == 0
    assert r["loss_finite"]
    producer.send_signal(signal.SIGTERM)
    assert producer.wait(30) == 0


@pytest.mark.timeout(400)
def test_pytorch_ranks_own_producers_write_into_shm_slots(procs, tmp_path) -> None:
    """--framework torch --transport shm: each rank's own producers write slots; zmq-consume trains on them in place."""
    import json

    from tests.conftest import ShmLeaks

    leaks = ShmLeaks()
    out_json = tmp_path / "r.json"
    run = procs.start(
        "bench_input.py", "--framework", "torch", "--transport", "shm", "--fake-location", "zmq-consume",
        "--input-only", "--num-gpus", "2", "--batch", "2", "--image-size", "4", "--warmup-steps", "2", "--steps", "5",
        "--repeats", "2", "--json", str(out_json),
    )  # fmt: skip
    _, err = run.communicate(timeout=360)
    assert run.returncode == 0, err[-3000:]
    doc = json.loads(out_json.read_text())
    assert doc["config"]["transport"] == "shm"
    r = doc["paths"]["zmq-consume"]
    assert r["zero_copy"] is True  # every rank's tensors were the slots: its endpoint was shm://
    assert r["batches_trained"] == 2 * 12 and r["loss_finite"]  # 2 ranks x (2 warm-up + 2 x 5)
    assert {row["rank"] for row in r["producers"]} == {0, 1}, r["producers"]
    assert all(row["lost"] == 0 and row["duplicated"] == 0 for row in r["producers"]), r["producers"]
    leaks.assert_none_left()
