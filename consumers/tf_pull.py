"""What the two Python paths share: a PULL socket read in Python (consumers.zmq_pull), as a tensorpack DataFlow.

Both pay for Python and the GIL on every batch, which is what they are here
to measure against the native op. The socket binds in `open`, before the
run's producers start, and its counters give the wire's and the producers'
figures (sequence numbers and the native header's extras).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
from tensorpack.dataflow import DataFlow, DataFlowTerminated

from consumers.expect import BatchSpec
from consumers.tf_half import TFInputPath
from consumers.zmq_pull import PullConsumer, ReceiveStopped, ReceiveTimeout
from profiler.telemetry import delivered_figures
from wire.errors import WireError


class PullFlow(DataFlow):
    """A tensorpack DataFlow over a PullConsumer; remembers why it stopped, in one line.

    It runs in a feeding thread (tensorpack's enqueue thread, tf.data's
    generator), so `interrupt` makes a waiting receive give up at once, and
    `close` waits for the receive to leave before closing the socket under it.
    """

    def __init__(self, consumer: PullConsumer | None, expected: BatchSpec | None = None) -> None:
        self.consumer = consumer
        self.expected = expected  # what each batch must be (the model's signature)
        self.error: str | None = None  # what ended the stream (a timeout, a malformed message, an odd batch)
        self._stopping = threading.Event()
        self._receiving = threading.Lock()

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        while True:
            with self._receiving:
                if self._stopping.is_set() or self.consumer is None:
                    # tensorpack's way to end a stream quietly; the run reports why in one line.
                    raise DataFlowTerminated("the input was stopped")
                try:
                    batch = self.consumer.recv(stop=self._stopping.is_set)
                except ReceiveStopped:
                    raise DataFlowTerminated("the input was stopped") from None
                except ReceiveTimeout:
                    refused = self.consumer.refusals()
                    self.error = f"no batch within {self.consumer.recv_timeout:g} s" + (
                        f"; {refused}" if refused else ""
                    )
                except WireError as e:
                    self.error = str(e)
                if self.error is None and self.expected is not None:
                    wrong = self.expected.mismatch(batch.arrays)
                    if wrong:
                        producer = f" from producer {batch.header.producer_id}" if batch.header is not None else ""
                        self.error = f"batch{producer} {wrong}"
                if self.error:
                    raise DataFlowTerminated(self.error)
            yield batch.arrays

    def interrupt(self) -> None:
        """Make a waiting receive give up at once (from any thread); the stream then ends."""
        self._stopping.set()

    def close(self) -> None:
        """Close the consumer once no receive is using it."""
        self._stopping.set()
        with self._receiving:
            if self.consumer is not None:
                self.consumer.close()
                self.consumer = None


class PythonPull(TFInputPath):
    """Base of the Python paths (not registered itself): the socket, its counters, its accounting."""

    def __init__(self, cfg, endpoint: str | None = None) -> None:
        super().__init__(cfg, endpoint)
        self.consumer: PullConsumer | None = None
        self.flow: PullFlow | None = None

    def open(self) -> None:
        if self.consumer is None:
            c = self.cfg
            self.consumer = PullConsumer(
                self.endpoint,
                bind=True,
                hwm=c.hwm,
                recv_timeout=c.recv_timeout,
                max_msg_size=c.max_msg_size,
                allow_remote=c.allow_remote,
                curve_keys=c.curve_keys,
            )
            if self.flow is not None:
                self.flow.consumer = self.consumer

    def dataflow(self, specs: list) -> PullFlow:
        """The flow the graph reads, checked against `specs`; its consumer is set by `open`, before the session runs."""
        self.flow = PullFlow(None, BatchSpec.from_signature(specs, self.cfg.batch))
        return self.flow

    def counters(self, session=None) -> dict | None:
        return None if self.consumer is None else self.consumer.counters()

    def producer_figures(self, window: tuple[dict, dict] | None) -> dict | None:
        """Delivered rate per producer over the measured steps (exact, consumer side), and the
        producer's own send latency over its last second (native header extras)."""
        c = self.consumer
        if c is None or not c.tracker.producers or window is None:
            return super().producer_figures(window)
        w0, w1 = window
        return delivered_figures(c.tracker.producers, w0["received"], self.cfg.batch, w1["time"] - w0["time"])

    def result_fields(self) -> dict:
        # Per producer, from sequence numbers: what arrived, what went missing or came twice.
        return {"producers": self.consumer.tracker.table()} if self.consumer is not None else {}

    def failure(self) -> str | None:
        return self.flow.error if self.flow is not None else None

    def interrupt(self) -> None:
        if self.flow is not None:
            self.flow.interrupt()

    def close(self) -> None:
        if self.flow is not None and self.flow.consumer is not None:
            self.flow.close()  # waits for the feeding thread to leave its receive
        elif self.consumer is not None:
            self.consumer.close()
        self.consumer = None
