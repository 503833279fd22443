"""A consumer that joins a standalone producer after another one left counts no loss for the batches it never saw.

The README's workflow leaves one producer running for many runs, each a new
consumer. The batches an earlier consumer took are not lost: the first
sequence number a consumer sees from a producer is where it joined
(`joined_at`), and only gaps after it are loss. Both trackers, the Python
consumer's and the native receiver's, keep this rule.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

from consumers.zmq_pull import PullConsumer
from wire.endpoints import free_tcp_port
from zmq_ops.receiver import Receiver

BATCH, SIZE = 2, 4
SPECS = [("uint8", (BATCH, SIZE, SIZE, 3)), ("int32", (BATCH,))]
FIRST_RUN, SECOND_RUN = 32, 8


def first_run(endpoint: str) -> int:
    """Take FIRST_RUN batches as an earlier consumer would; the last seq it saw."""
    with PullConsumer(endpoint, recv_timeout=60) as c:
        for _ in range(FIRST_RUN):
            c.recv()
        (count,) = c.tracker.producers.values()
    assert count.received == FIRST_RUN and count.lost == 0
    return count.next_seq - 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("second", ["python", "native"])
def test_a_later_consumer_of_a_standalone_producer_counts_no_loss(procs, ipc_dir, second) -> None:
    endpoint = f"ipc://{ipc_dir}/feed"
    producer = procs.producer(endpoint, "--batch", str(BATCH), "--image-size", str(SIZE))
    last_seen = first_run(endpoint)
    if second == "python":
        with PullConsumer(endpoint, recv_timeout=60) as c:
            for _ in range(SECOND_RUN):
                c.recv()
            (row,) = c.tracker.table()
        assert row["joined_at"] > last_seen, row
        got = (row["received"], row["lost"], row["duplicated"], row["restarts"])
    else:
        ring = [[np.zeros(s, d) for d, s in SPECS] for _ in range(3)]
        with Receiver(endpoint, SPECS, ring, timeout_ms=60_000) as r:
            for _ in range(SECOND_RUN):
                r.release(r.next())
            (row,) = r.producers()
        got = tuple(row[1:])
    # The native receiver's threads take batches ahead of the ones handed out: at least SECOND_RUN arrived.
    assert got[0] >= SECOND_RUN and got[1:] == (0, 0, 0), got
    assert producer.poll() is None, producer.stderr.read()


def test_a_closed_python_consumer_leaves_its_tcp_port_free_for_the_next_bind() -> None:
    """A run's paths bind one endpoint in turn: python-dataset's socket, then the native op's.

    ZMQ closes a socket in its I/O thread after `close` returns; a bind right
    after it, as libzmq binds (SO_REUSEADDR), must not find the port in use.
    """
    for _ in range(20):
        port = free_tcp_port()
        with PullConsumer(f"tcp://127.0.0.1:{port}", recv_timeout=60):
            pass
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
