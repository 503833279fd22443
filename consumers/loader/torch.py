"""`loader`: the user's own loader (--loader MODULE:CALLABLE) iterated inside each rank, as a training script does.

A `DataLoader` is iterated as it is, with `pin_memory` turned on where the
rank has a GPU (its own workers decode; its pin thread copies into pinned
memory), and each batch goes to the device on a side stream through
`SideCopy` (feeders/device_copy.py, the helper every PyTorch path copies
with), so the copy overlaps the previous step's work instead of queueing
behind it. Any other loader (a Dataset, a tf.data.Dataset, a DataFlow, an
iterable) runs on the pinned-memory, side-stream feeder of python-queue. Each rank builds
its own copy with its own shard of the seed (`shard`, `num_shards` = rank,
world where the callable takes them). No producers: this is the loader where
users run it, against the same model and report.
"""

from __future__ import annotations

import numpy as np
import torch

from consumers.loader.path import PATH
from consumers.torch_half import RankContext, TorchInputPath, labels_of
from core import loader_processes
from core.loader_spec import (
    Batcher,
    LoaderError,
    LoaderSpec,
    _pair,
    batches,
    exception_words,
    guarded,
    kind_of,
    prepare_dataloader,
    worker_seed,
)
from core.registry import register
from feeders.device_copy import SideCopy
from feeders.torch import Prefetcher
from frameworks.torch_trace import stage


@register
class UserLoader(TorchInputPath):
    declaration = PATH

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        cfg = self.cfg
        spec = LoaderSpec.parse(cfg.loader, cfg.loader_arg)
        seed = worker_seed(0, ctx.rank)
        offer = {"batch_size": cfg.batch, "image_size": cfg.image_size}
        self.prefetch, self.it, self.passes = None, None, []  # what close() stops, however far open() got
        self.copier = None  # a GPU rank's side-stream copy of a DataLoader's batches
        obj = spec.build(seed, ctx.rank, ctx.world, offer, timeout=cfg.loader_timeout)
        kind = kind_of(obj)
        if kind == "dataloader":
            if ctx.device.type == "cuda":
                obj.pin_memory = True  # read when the iterator is made
                self.copier = SideCopy(ctx.device)
            # Its workers are forked from a rank that blocks SIGTERM in its threads: let them be stopped.
            prepare_dataloader(obj)
            self.batcher = Batcher(spec.name, cfg.batch, cfg.batch, cfg.image_size)
            loader = obj

            def epochs():
                if ctx.device.type == "cuda":  # the DataLoader's pin thread takes the device current here
                    torch.cuda.set_device(ctx.device)  # (per host thread: this one is the pumping thread's)
                while True:
                    self.passes.append(iter(loader))
                    yield from self.passes[-1]

            # Asked for a batch only when the step asks: the DataLoader's own workers read ahead, and a batch
            # it hands over is used in place (a loader may reuse its output tensors).
            self.it = guarded(epochs(), spec.name, cfg.loader_timeout, ahead=0, prepare=lambda item: item)
            return
        del obj  # the feeder's thread builds its own copy, so its iteration lives on that thread

        def source():
            it = batches(spec, cfg.batch, cfg.batch, cfg.image_size, seed, ctx.rank, ctx.world, cfg.loader_timeout)
            return ([images, labels] for images, labels in it)

        self.prefetch = Prefetcher(source, ctx.device, depth=2, name="loader", source_stage="feedbench.load")

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.prefetch is not None:
            images, labels = self.prefetch.next()
            return images, labels_of(labels)
        with stage("feedbench.load"):
            pair = _pair(next(self.it))
        if pair is None or not all(isinstance(t, torch.Tensor) for t in pair):
            raise LoaderError(f"loader {self.cfg.loader}: its DataLoader yields no (images, labels) tensors")
        images, labels = pair
        try:
            as_numpy = images.numpy(), np.asarray(labels.numpy())  # views: nothing copied
        except (TypeError, RuntimeError) as e:  # bfloat16, sparse or otherwise unreadable tensors
            raise self.batcher.fail(f"images {images.dtype}, labels {labels.dtype}: {exception_words(e)}") from None
        self.batcher.check(*as_numpy)
        self.batcher.count += 1
        if self.copier is not None:  # from the pin thread's pinned tensors, on the side stream
            images, labels = self.copier.copy((images, labels))
        return images, labels_of(labels)  # the labels widened on the device, after the copy

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        else:
            if self.it is not None:
                self.it.close()  # the pumping thread stops at its next batch
            for it in self.passes:
                shutdown = getattr(it, "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()
        # What the callable started (a cache server) is stopped with the path, in every rank; rank 0 names it.
        left = loader_processes.stop_started()
        if getattr(self, "ctx", None) is None or self.ctx.rank == 0:
            loader_processes.say_left(self.cfg.loader, left)
