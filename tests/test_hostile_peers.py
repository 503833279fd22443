"""Peers that send hostile bytes to a consumer's native receive core, as separate processes on real sockets.

A flood of malformed messages costs the receiver no memory per message and
does not hold back a good batch; another user's connections cannot fill the
shm:// hand-over socket's backlog; sequence numbers near 2^64 neither
overflow the loss count nor hide a producer's loss.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time

import numpy as np
import pytest

from wire import shm
from zmq_ops.receiver import BatchError, Receiver, ReceiveTimeout

BATCH, SIZE = 2, 4
SPECS = [("uint8", (BATCH, SIZE, SIZE, 3)), ("int32", (BATCH,))]
FLOOD = 200_000

# A PUSH peer: sends its messages, then stays until the test closes its stdin (its batches are all read by then).
PEER = f"""
import sys
import numpy as np
import zmq
from wire import message

ctx = zmq.Context()
push = ctx.socket(zmq.PUSH)
push.connect(sys.argv[1])
what = sys.argv[2]
good = [np.full((2, 4, 4, 3), 7, np.uint8), np.arange(2, dtype=np.int32)]
if what == "flood":
    for _ in range({FLOOD}):
        push.send(b"\\xff\\xff\\xff\\x7f")  # a 4-byte zmq_ops message declaring 2^31 - 1 tensors
    message.send(push, good, producer_id=5, seq=0)
else:  # sequence numbers: id 1 joins at 2^63 and loses 4; id 2 jumps from 0 to 2^64 - 1
    for pid, seq in [(1, 2**63), (1, 2**63 + 5), (2, 0), (2, 2**64 - 1)]:
        message.send(push, good, producer_id=pid, seq=seq)
print("sent", flush=True)
sys.stdin.read()
"""


def start_peer(procs, endpoint: str, what: str):
    peer = procs.start("-c", PEER, endpoint, what, stdin=subprocess.PIPE)
    assert peer.stdout.readline() == "sent\n", peer.stderr.read()
    return peer


def wait_for(what, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "the receiver never got there"
        time.sleep(0.01)


def test_a_flood_of_malformed_messages_costs_one_report_and_does_not_hold_back_a_batch(procs, ipc_dir) -> None:
    endpoint = f"ipc://{ipc_dir}/flood"
    ring = [[np.zeros(shape, dtype) for dtype, shape in SPECS] for _ in range(2)]
    with Receiver(endpoint, SPECS, ring, hwm=100) as r:
        peer = start_peer(procs, endpoint, "flood")
        wait_for(lambda: r.bad_messages() == FLOOD and r.stats()[1] == 1)
        i = r.next(1000)  # the good batch first: nothing queued per bad message ahead of it
        assert (ring[i][0] == 7).all() and list(ring[i][1]) == [0, 1]
        r.release(i)
        with pytest.raises(BatchError, match=rf"^{FLOOD} bad messages; the last: bad zmq_ops message .*n_tensors"):
            r.next(1000)
        with pytest.raises(ReceiveTimeout):  # reported once
            r.next(100)
        peer.stdin.close()


def test_hostile_sequence_numbers_neither_overflow_nor_hide_loss(procs, ipc_dir) -> None:
    endpoint = f"ipc://{ipc_dir}/seq"
    with Receiver(endpoint, SPECS, 4, zero_copy=True, timeout_ms=30_000) as r:
        peer = start_peer(procs, endpoint, "seq")
        for _ in range(4):
            r.next_arrays()
        rows = {row[0]: row[1:] for row in r.stats()[0]}
        peer.stdin.close()
    # (received, lost, duplicated, restarts): a first seq of 2^63 is where the consumer joined, the jump of
    # 5 after it loses 4; a jump of 2^64 - 1 saturates the loss count instead of wrapping it negative
    assert rows == {1: (2, 4, 0, 0), 2: (2, 2**63 - 1, 0, 0)}, rows


SQUATTER = """
import os, socket, sys, time
os.setgid({gid}); os.setuid({uid})
held = []
for _ in range(300):  # more than the listen backlog (128)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect("\\0" + sys.argv[1])
    except (BlockingIOError, ConnectionRefusedError, OSError):
        s.close()
        continue
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root to start")
def test_another_users_connections_cannot_hold_the_hand_over_backlog(procs) -> None:
    endpoint = f"shm://squat-{os.getpid()}"
    nobody = pwd.getpwnam("nobody")
    with Receiver(endpoint, SPECS, 4, zero_copy=True, timeout_ms=30_000) as r:
        squatter = procs.start(
            "-c", SQUATTER.format(uid=nobody.pw_uid, gid=nobody.pw_gid), shm.handover_address(endpoint)[1:].decode(),
            stdin=subprocess.PIPE,
        )  # fmt: skip
        assert int(squatter.stdout.readline()) >= 128, squatter.stderr.read()  # it filled the backlog
        producer = procs.producer(endpoint, "--batch", str(BATCH), "--image-size", str(SIZE), "--count", "3")
        for _ in range(3):
            images, labels = r.next_arrays()
            assert images.shape == SPECS[0][1]
            del images, labels
        assert producer.poll() is None, producer.stderr.read()  # (it stays until this consumer leaves)
        squatter.stdin.close()
