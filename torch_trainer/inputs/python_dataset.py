"""`python-dataset`: torch.utils.data.DataLoader over an IterableDataset whose worker processes pull
from the producers, with `pin_memory`; the step copies each batch to the device asynchronously.

Each loader worker binds an endpoint of its own and is fed by its share of
the rank's producers (one worker per producer). Batches carry their producer
id and sequence number, so the trainer keeps exact per-producer accounting of
what reached it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from consumers.accounting import SeqTracker
from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from core.errors import InputError
from core.registry import register
from torch_trainer.inputs.base import ProducerFed, RankContext, labels_of, rank_producer_ids
from torch_trainer.prefetch import as_tensor


class PullDataset(IterableDataset):
    """Batches pulled in a loader worker from endpoints[worker id]; yields (images, labels, [producer, seq])."""

    def __init__(self, endpoints: list[str], cfg: Any) -> None:
        self.endpoints = endpoints
        self.hwm = cfg.hwm
        self.recv_timeout = cfg.recv_timeout
        self.max_msg_size = cfg.max_msg_size
        self.allow_remote = cfg.allow_remote
        self.curve_keys = cfg.curve_keys

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        endpoint = self.endpoints[info.id if info is not None else 0]
        with PullConsumer(
            endpoint, True, self.hwm, self.recv_timeout, self.max_msg_size, self.allow_remote, self.curve_keys
        ) as consumer:
            while True:
                batch = consumer.recv()
                images, labels = batch.arrays[:2]
                h = batch.header
                ident = torch.tensor([h.producer_id, h.seq] if h is not None else [-1, -1])
                # Copied once, into the tensor the loader hands to the trainer process (shared memory).
                yield as_tensor(images).clone(), as_tensor(labels).clone(), ident


def _take_signals(worker_id: int) -> None:
    """Loader workers are forked from a rank that blocks SIGTERM in its threads: let them be stopped."""
    from runner.shutdown import unblock_in_child

    unblock_in_child()


@register
class PythonDataset(ProducerFed):
    name: ClassVar[str] = "python-dataset"
    summary: ClassVar[str] = "DataLoader workers pull from the producers (IterableDataset), pin_memory, async copy"
    order: ClassVar[int] = 30
    advice: ClassVar[str] = "the loader workers limit: use zmq-consume (native receive threads), or more producers"

    loader_iter = None

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        cfg = self.cfg
        workers = len(rank_producer_ids(cfg.producers, ctx.rank, ctx.world))
        endpoints = [ctx.endpoint(cfg, self.name, w) for w in range(workers)]
        self.tracker = SeqTracker()
        self.trained = 0
        self.loader = DataLoader(
            PullDataset(endpoints, cfg),
            batch_size=None,
            num_workers=workers,
            pin_memory=ctx.device.type == "cuda",
            prefetch_factor=2,
            multiprocessing_context="fork",
            worker_init_fn=_take_signals,
        )
        self.loader_iter = iter(self.loader)  # the workers start and bind their endpoints
        self.start(endpoints)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            images, labels, ident = next(self.loader_iter)
        except ReceiveTimeout as e:
            raise InputError(f"{self.name}: {str(e).strip().splitlines()[-1]}") from None
        pid, seq = (int(x) for x in ident)
        if pid >= 0:
            self.tracker.add(pid, seq)
        self.trained += 1
        dev = self.ctx.device
        return images.to(dev, non_blocking=True), labels_of(labels).to(dev, non_blocking=True)

    def accounting(self) -> dict:
        # What reached the trainer; batches still in the workers' prefetch are not counted.
        return {"producers": self.tracker.table(), "batches_pulled": self.trained}

    def close(self) -> None:
        if self.loader_iter is not None:
            self.loader_iter._shutdown_workers()
            self.loader_iter = None
        self.stop_producers()
