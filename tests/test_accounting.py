"""Exact accounting: every batch of every producer arrives once, and gaps or repeats are counted."""

from __future__ import annotations

import pytest

from consumers.accounting import SeqTracker
from consumers.zmq_pull import PullConsumer

pytestmark = pytest.mark.timeout(180)


def test_four_producers_times_a_thousand_batches_lose_and_repeat_nothing(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/fanin"
    with PullConsumer(endpoint, recv_timeout=60, hwm=16) as c:
        ps = [
            procs.producer(endpoint, "--count", "1000", "--batch", "2", "--image-size", "4", "--producer-id", str(i))
            for i in range(4)
        ]
        for _ in range(4000):
            c.recv()
        c.recv_timeout = 0.5
        with pytest.raises(TimeoutError):
            c.recv()  # and not one more
    for p in ps:
        assert p.wait(60) == 0
    rows = c.tracker.table()
    assert [r["producer"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert (r["received"], r["lost"], r["duplicated"], r["restarts"]) == (1000, 0, 0, 0)
    assert all(pc.last_sent == 999 for pc in c.tracker.producers.values())


def test_tracker_counts_gaps_repeats_and_restarts():
    t = SeqTracker()
    for seq in [0, 1, 2, 5, 6, 6, 3, 0, 1]:
        t.add(producer_id=9, seq=seq)
    c = t.producers[9]
    assert (c.received, c.lost, c.duplicated, c.restarts) == (9, 2, 2, 1)


def test_a_restarted_producer_is_picked_up_again(procs, ipc_dir):
    endpoint = f"ipc://{ipc_dir}/restart"
    with PullConsumer(endpoint, recv_timeout=60) as c:
        first = procs.producer(endpoint, "--batch", "2", "--image-size", "4", "--producer-id", "3")
        for _ in range(5):
            c.recv()
        first.kill()
        first.wait()
        procs.producer(endpoint, "--batch", "2", "--image-size", "4", "--producer-id", "3")
        # Drain what the first one left in flight (queues at both ends, up to the high-water
        # marks), then the new stream must start again at 0.
        drained = 0
        while c.recv().header.seq != 0:
            drained += 1
            assert drained < 50_000, "the restarted producer's stream never arrived"
    assert c.tracker.producers[3].restarts == 1
