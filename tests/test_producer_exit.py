"""A producer that sends N batches and exits: its consumer gets all N, even when it reads slowly.

libzmq's receiving side drops the bytes still queued in the kernel when an
ipc:// sender hangs up while the receiver sits at its high-water mark, so a
producer leaves only once its consumer has read every byte it sent
(producers/sender.py, _wait_for_delivery), not after a fixed wait.
"""

from __future__ import annotations

import time

import numpy as np

from zmq_ops.receiver import Receiver

BATCH, SIZE, COUNT = 2, 32, 30  # 30 batches fit in the socket queues: every send returns at once
SPECS = [("uint8", (BATCH, SIZE, SIZE, 3)), ("int32", (BATCH,))]
GIVE_UP_AFTER = 2.0


def test_a_finished_producer_delivers_every_batch_to_a_slow_consumer(procs, ipc_dir) -> None:
    endpoint = f"ipc://{ipc_dir}/feed"
    with Receiver(endpoint, SPECS, 2, hwm=4, timeout_ms=10_000, zero_copy=True) as r:
        producer = procs.producer(
            endpoint, "--batch", str(BATCH), "--image-size", str(SIZE), "--count", str(COUNT), "--hwm", "4",
            "--give-up-after", str(GIVE_UP_AFTER),
        )  # fmt: skip
        first = r.next_arrays(30_000)  # the producer is up and has sent all its batches at once
        del first
        # A consumer busy for a while, then slower than its producer: when the producer's --give-up-after has
        # passed since its last send, most of its batches are still queued in the kernel (the old producer
        # exited then, and they were lost without a trace in the sequence numbers).
        time.sleep(0.75 * GIVE_UP_AFTER)
        for _ in range(COUNT - 1):
            images, labels = r.next_arrays()
            assert images.shape == (BATCH, SIZE, SIZE, 3) and labels.dtype == np.int32
            del images, labels
            time.sleep(0.03)
        # the producer leaves once everything is read, while this consumer is still there
        assert producer.wait(30) == 0, producer.stderr.read()
        rows = r.stats()[0]
    assert [(row[1], row[2]) for row in rows] == [(COUNT, 0)], rows
