"""Exact accounting: every batch of every producer arrives once, and gaps or repeats are counted."""

from __future__ import annotations

import pytest

from consumers.accounting import SeqTracker, StreamTracker
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


def test_streams_that_split_one_source_count_each_seq_once_and_what_never_came():
    t = StreamTracker(shared=True)
    for stream, seq in [(7, 0), (9, 1), (7, 2), (9, 4), (7, 5), (9, 5)]:
        t.add(stream, seq)
    # seq 5 came twice; seq 3 is below both streams' latest (5) and never came
    assert t.overall() == {"received": 6, "distinct": 5, "duplicated": 1, "missing": 1}
    assert [(r["producer"], r["received"], r["duplicated"], r["joined_at"]) for r in t.table()] == [
        (0, 3, 0, 0),
        (1, 3, 1, 1),
    ]


def test_a_stream_whose_worker_is_gone_no_longer_holds_back_what_counts_as_missing():
    t = StreamTracker(shared=True)
    for stream, seq in [(7, 0), (9, 1), (7, 2), (9, 3)]:
        t.add(stream, seq)
    gone_at = t.arrivals  # stream 7's worker is seen gone here; it had taken seq 4 and 6 and delivers nothing more
    for seq in (5, 7, 8, 9):
        t.add(9, seq)
    assert t.ended(1, gone_at) == [0]  # stream 9 delivered since; stream 7 (numbered 0) is the one that ended
    assert t.ended(0, gone_at) == []
    assert t.overall() == {"received": 8, "distinct": 8, "duplicated": 0, "missing": 0}  # held back at seq 2
    assert t.overall(ended=[0]) == {"received": 8, "distinct": 8, "duplicated": 0, "missing": 2}  # 4 and 6


def test_a_stream_that_hands_over_what_the_client_had_buffered_after_its_worker_is_seen_gone_still_ended():
    t = StreamTracker(shared=True)
    for stream, seq in [(7, 0), (9, 1)]:
        t.add(stream, seq)
    gone_at = t.arrivals
    t.add(7, 2)  # taken by the client before the worker died, counted just after
    for seq in range(3, 9):
        t.add(9, seq)
    assert t.ended(1, gone_at) == [0]


def test_a_worker_gone_before_its_stream_began_ends_no_stream():
    t = StreamTracker(shared=True)
    for seq in range(4):
        t.add(3, seq)
    gone_at = t.arrivals
    t.add(3, 4)
    assert t.ended(1, gone_at) == []


def test_streams_that_each_run_the_whole_source_are_counted_as_producers():
    t = StreamTracker(shared=False)
    for stream, seq in [(5, 0), (5, 1), (6, 0), (5, 3), (6, 1)]:
        t.add(stream, seq)
    assert t.overall() is None
    assert [(r["producer"], r["received"], r["lost"]) for r in t.table()] == [(0, 3, 1), (1, 2, 0)]
