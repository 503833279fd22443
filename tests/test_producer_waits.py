"""A standalone producer waits for its first consumer, however late it comes.

"Start the producers, then the trainer" is the tool's main use; on a slow
machine the trainer may reach its consumer minutes later. The give-up timer
only runs once a consumer has taken a batch. The wait here is the behaviour
under test, not a guess at how long start-up takes: 13 times the producers'
--give-up-after, and longer than the 60 s after which producers used to give up.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

from consumers.zmq_pull import PullConsumer
from zmq_ops.receiver import Receiver

BATCH, SIZE = 2, 4
SPECS = [("uint8", (BATCH, SIZE, SIZE, 3)), ("int32", (BATCH,))]
SMALL = ("--batch", str(BATCH), "--image-size", str(SIZE), "--workers", "2", "--give-up-after", "5")
LATE_BY_S = 65


@pytest.mark.timeout(LATE_BY_S + 180)
def test_producers_started_a_minute_before_their_consumers_feed_them(procs, ipc_dir) -> None:
    ipc = f"ipc://{ipc_dir}/feed"
    shm_ep = f"shm://t-{uuid.uuid4().hex[:12]}"
    # --give-up-after 5 is far shorter than the wait: only a consumer that has taken a batch arms it.
    by_ipc = procs.producer(ipc, *SMALL)
    by_shm = procs.producer(shm_ep, *SMALL)
    time.sleep(LATE_BY_S)
    for p in (by_ipc, by_shm):
        assert p.poll() is None, p.stderr.read()

    with PullConsumer(ipc, recv_timeout=60) as c:
        seen: set[int] = set()
        deadline = time.monotonic() + 120  # each worker reconnects in its own time: one may fill the queue first
        while seen != {0, 1} and time.monotonic() < deadline:
            seen.add(c.recv().header.producer_id)
    assert seen == {0, 1}

    ring = [[np.zeros(s, d) for d, s in SPECS] for _ in range(3)]
    with Receiver(shm_ep, SPECS, ring, timeout_ms=60_000) as r:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            slot = r.next()
            assert ring[slot][0].shape == (BATCH, SIZE, SIZE, 3)
            r.release(slot)
            if {row[0] for row in r.producers()} == {0, 1}:
                break
        assert {row[0] for row in r.producers()} == {0, 1}

    # Their consumers are gone: now the give-up timer runs, and both stop by themselves.
    for p in (by_ipc, by_shm):
        assert p.wait(120) == 3
        assert "no consumer took a batch for 5 s" in p.stderr.read()
