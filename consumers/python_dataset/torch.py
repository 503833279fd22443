"""`python-dataset`: torch.utils.data.DataLoader over an IterableDataset whose worker processes pull
from the producers, with `pin_memory`; each batch is copied to the device on a side stream, the next
batch's copy overlapping the current step, and its labels widened to int64 on the device.

Each loader worker binds an endpoint of its own and is fed by its share of
the rank's producers (producer k feeds worker k mod workers): `--dataset-workers`
per rank, by default one per producer of the rank. The workers are the
path's own setting, so a figure can be measured at any count of them, not
only at the producers' count. Batches carry their producer
id and sequence number, so the trainer keeps exact per-producer accounting of
what reached it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from consumers.accounting import SeqTracker
from consumers.python_dataset.path import PATH
from consumers.torch_half import (
    ProducerFed,
    RankContext,
    check_batch,
    expected_batch,
    labels_of,
    rank_producer_ids,
)
from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from core.errors import ConfigError, InputError
from core.registry import register
from feeders.device_copy import SideCopy
from feeders.torch import as_tensor
from frameworks.torch_trace import stage


class PullDataset(IterableDataset):
    """Batches pulled in a loader worker from endpoints[worker id]; yields (images, labels, [producer, seq])."""

    def __init__(self, endpoints: list[str], cfg: Any) -> None:
        self.endpoints = endpoints
        self.hwm = cfg.hwm
        self.recv_timeout = cfg.recv_timeout
        self.max_msg_size = cfg.max_msg_size
        self.allow_remote = cfg.allow_remote
        self.curve_keys = cfg.curve_keys
        self.expected = expected_batch(cfg)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        endpoint = self.endpoints[info.id if info is not None else 0]
        with PullConsumer(
            endpoint, True, self.hwm, self.recv_timeout, self.max_msg_size, self.allow_remote, self.curve_keys
        ) as consumer:
            while True:
                batch = consumer.recv()
                h = batch.header
                check_batch(self.expected, batch.arrays, h.producer_id if h is not None else None)
                images, labels = batch.arrays
                ident = torch.tensor([h.producer_id, h.seq] if h is not None else [-1, -1])
                # Copied once, into the tensor the loader hands to the trainer process (shared memory).
                yield as_tensor(images).clone(), as_tensor(labels).clone(), ident


def _take_signals(worker_id: int) -> None:
    """Loader workers are forked from a rank that blocks SIGTERM in its threads: let them be stopped."""
    from runner.shutdown import unblock_in_child

    unblock_in_child()


@register
class PythonDataset(ProducerFed):
    declaration = PATH

    loader_iter = None

    def endpoints(self, ctx: RankContext) -> list[str]:
        """One endpoint per loader worker: --dataset-workers, else one per producer of the rank."""
        producers = len(rank_producer_ids(self.cfg.producers, ctx.rank, ctx.world))
        workers = self.cfg.dataset_workers or producers
        if workers > producers:  # producer k feeds endpoint k mod workers: a worker beyond them would get nothing
            raise ConfigError(
                f"--dataset-workers {workers}: rank {ctx.rank} has {producers} producer(s) (--producers "
                f"{self.cfg.producers} over {ctx.world} ranks); each worker needs one to feed it"
            )
        return [ctx.endpoint(self.cfg, self.name, w) for w in range(workers)]

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        cfg = self.cfg
        endpoints = self.endpoints(ctx)
        workers = len(endpoints)
        self.tracker = SeqTracker()
        self.trained = 0
        self.copier = SideCopy(ctx.device)
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
        if self.group is not None:
            # A producer that died leaves its worker waiting for the receive timeout: stop the workers, so
            # the step's wait ends now and check() names the producer.
            self.group.on_failure(self._stop_workers)

    def _stop_workers(self) -> None:
        for w in getattr(self.loader_iter, "_workers", []):
            if w.is_alive():
                w.terminate()

    def _pull(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The loader's next batch, in pinned host memory on a GPU machine; counted by producer."""
        try:
            with stage("feedbench.wait"):  # for the loader workers, which receive in processes of their own
                images, labels, ident = next(self.loader_iter)
        except (RuntimeError, OSError):  # workers stopped because a producer died (mid-read: a reset pipe): name it
            self.check()
            raise
        except ReceiveTimeout as e:
            raise InputError(
                str(e).strip().splitlines()[-1].removeprefix("consumers.zmq_pull.ReceiveTimeout: ")
            ) from None
        pid, seq = (int(x) for x in ident)
        if pid >= 0:
            self.tracker.add(pid, seq)
        self.trained += 1
        return images, labels

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        # This step's batch only: the loader's workers and pin thread read ahead (prefetch_factor), so asking
        # for the next batch here would make this step wait for it. The copy overlaps the previous step's work;
        # without a GPU the loader's tensors are the step's input.
        images, labels = self.copier.copy(self._pull())
        return images, labels_of(labels)  # int32 -> int64 on the device, after the copy

    def result_fields(self) -> dict:
        # What reached the trainer; batches still in the workers' prefetch are not counted.
        return {"producers": self.tracker.table(), "batches_pulled": self.trained}

    def close(self) -> None:
        if self.loader_iter is not None:
            self.loader_iter._shutdown_workers()
            self.loader_iter = None
        self.stop_producers()
