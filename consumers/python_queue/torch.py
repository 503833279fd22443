"""`python-queue`: a Python thread pulls batches from the producers, copies them into pinned host memory,
and prefetches them onto the device on a side stream (feeders/torch.py).

The PyTorch counterpart of tensorpack's QueueInput: Python and the GIL are
paid on every batch, which is what this path is here to measure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import torch

from consumers.python_queue.path import PATH
from consumers.torch_half import (
    ProducerFed,
    RankContext,
    check_batch,
    expected_batch,
    labels_of,
)
from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from core.errors import InputError
from core.registry import register
from feeders.torch import Prefetcher
from profiler.telemetry import SampledQueue, delivered_figures

POLL_S = 0.2  # the thread checks for a stop this often while no batch arrives


def pull(consumer: PullConsumer, timeout: float, stopped, expected=None, headers=None) -> Iterator[list[np.ndarray]]:
    """Batches from `consumer`, polling in short slices so a stop is seen; ReceiveTimeout after `timeout` s.

    With `expected` (a BatchSpec), a batch of another layout raises BatchMismatch; `headers` is called with
    each batch's native header (None for the zmq_ops format).
    """
    waited = 0.0
    while not stopped():
        try:
            batch = consumer.recv()
        except ReceiveTimeout:
            waited += POLL_S
            if waited >= timeout:
                refused = consumer.refusals()
                raise ReceiveTimeout(f"no batch within {timeout:g} s" + (f"; {refused}" if refused else "")) from None
            continue
        waited = 0.0
        if expected is not None:
            check_batch(expected, batch.arrays, batch.header.producer_id if batch.header is not None else None)
        if headers is not None:
            headers(batch.header)
        yield batch.arrays


@register
class PythonQueue(ProducerFed):
    declaration = PATH
    depth: ClassVar[int] = 4

    consumer: PullConsumer | None = None
    prefetch: Prefetcher | None = None

    def endpoints(self, ctx: RankContext) -> list[str]:
        return [ctx.endpoint(self.cfg, self.name)]

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        cfg = self.cfg
        endpoint = ctx.endpoint(cfg, self.name)
        self.consumer = PullConsumer(
            endpoint, True, cfg.hwm, POLL_S, cfg.max_msg_size, cfg.allow_remote, cfg.curve_keys
        )  # fmt: skip
        self.start([endpoint])
        consumer, expected = self.consumer, expected_batch(cfg)
        self.prefetch = Prefetcher(
            lambda: pull(
                consumer, cfg.recv_timeout, lambda: self.prefetch is not None and self.prefetch.stopped(), expected
            ),
            ctx.device,
            depth=self.depth,
            name="python-queue",
            check=self.check,
            source_stage="feedbench.receive",  # off the wire, in the feeding thread
        )

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            images, labels = self.prefetch.next()
        except ReceiveTimeout as e:
            raise InputError(str(e)) from None
        return images, labels_of(labels)

    def counters(self, session=None) -> dict | None:
        return None if self.consumer is None else self.consumer.counters()

    def sampled_stages(self) -> list:
        return [SampledQueue(self.prefetch.queue_sizes if self.prefetch else [], self.depth)]

    def producer_figures(self, window: tuple[dict, dict] | None) -> dict | None:
        """Delivered rate per producer over the window (exact, consumer side) and the native headers' extras."""
        if window is None or self.consumer is None:
            return None
        w0, w1 = window
        return delivered_figures(
            self.consumer.tracker.producers, w0["received"], self.cfg.batch, w1["time"] - w0["time"]
        )

    def result_fields(self) -> dict:
        if self.consumer is None:
            return {}
        return {"producers": self.consumer.tracker.table(), "batches_pulled": self.consumer.batches}

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        self.stop_producers()
        if self.consumer is not None and (self.prefetch is None or not self.prefetch.alive()):
            self.consumer.close()
