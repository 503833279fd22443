"""What a PyTorch input path provides, and the pieces the producer-fed paths share.

A path is opened on each rank (`open(ctx)`), hands the training step one
batch per `next()` as (uint8 NHWC images, int64 labels) on the rank's device,
and reports raw state through the stage contract (core.registry.InputPath:
counters, sampled_stages, producer_figures, result_fields). Each rank pulls from its own
endpoint, fed by its share of the run's producers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.registry import InputPath


@dataclass
class RankContext:
    """Where a path runs: this rank among `world`, its device, and a private folder for sockets."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    tmpdir: str  # <the run folder>/r<rank>
    result_dir: str | None = None  # the run's folder (the rank's `tmpdir` is inside it)

    def endpoint(self, cfg: Any, path: str, part: int | None = None) -> str:
        """This rank's endpoint (and a part of it, for one per loader worker).

        With `--endpoint`, rank r uses the given TCP port + r (ipc: the path
        with "-r<r>"), so external producers can address each rank. With
        `--transport shm` the rank's own producers write into shared-memory
        slots: shm://<run>-r<rank>-<path>.
        """
        suffix = "" if part is None else f"-w{part}"
        if cfg.endpoint:
            if cfg.endpoint.startswith("tcp://"):
                host, port = cfg.endpoint.rsplit(":", 1)
                return f"{host}:{int(port) + self.rank * 16 + (part or 0)}"
            return f"{cfg.endpoint}-r{self.rank}{suffix}"
        if cfg.transport == "shm":  # slots in shared memory; the sockets are abstract (wire/shm.py): no file here
            return f"shm://{os.path.basename(os.path.dirname(self.tmpdir))}-r{self.rank}-{path}{suffix}"
        return f"ipc://{self.tmpdir}/{path}{suffix}"


class TorchInputPath(InputPath):
    """A PyTorch input path; subclasses implement `open`, `next` and `close`."""

    framework: ClassVar[str] = "torch"
    decoded_on: str | None = None  # where DALI decoded this rank's batches (the dali path and dali producers)

    def open(self, ctx: RankContext) -> None:
        """Start what the path needs on this rank (producers, sockets, loader workers)."""
        self.ctx = ctx

    def endpoints(self, ctx: RankContext) -> list[str]:
        """The endpoints this path reads on rank `ctx.rank` (none: it reads no socket); errors name them."""
        return []

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop everything `open` started; called once, also after a failure."""

    def check(self) -> None:
        """Between steps: raise if a producer the path depends on has died."""

    def rank_fields(self) -> dict:
        """This rank's part of the path's own result fields (merged over the ranks as its declaration says):
        `result_fields()`, and where DALI or nvJPEG decoded, where that was."""
        fields = self.result_fields()
        return {**fields, "decoded_on": self.decoded_on} if self.decoded_on else fields


def expected_batch(cfg: Any):
    """What every batch from a producer must be: uint8 [batch, size, size, 3] images and int32 [batch] labels."""
    from consumers.expect import BatchSpec

    return BatchSpec.images(cfg.batch, cfg.image_size)


def check_batch(expected, arrays, producer_id: int | None) -> None:
    """Raise BatchMismatch naming the producer and both layouts when `arrays` are not what the run expects."""
    from consumers.expect import BatchMismatch

    wrong = expected.mismatch(arrays)
    if wrong:
        who = f" from producer {producer_id}" if producer_id is not None else ""
        raise BatchMismatch(f"batch{who} {wrong}")


def labels_of(t: torch.Tensor) -> torch.Tensor:
    """Class labels as cross-entropy wants them (int64, one per image)."""
    return t.reshape(-1).long()


def rank_producer_ids(producers: int, rank: int, world: int) -> list[int]:
    """This rank's share of the run's producers (ids 1000 x i, as the TensorFlow trainer numbers them).

    Producer i goes to rank i mod world; a rank left without one gets one of its own.
    """
    mine = [1000 * i for i in range(producers) if i % world == rank]
    return mine or [1000 * (producers + rank)]


class ProducerFed(TorchInputPath):
    """A path fed by producer processes: starts this rank's share, and notices one that dies."""

    group = None
    watch = None  # --on-producer-exit over `group`, made at the first check

    def start(self, endpoints: list[str]) -> None:
        self.producer_ids = rank_producer_ids(self.cfg.producers, self.ctx.rank, self.ctx.world)
        gpu = self.ctx.device.index if self.ctx.device.type == "cuda" else None
        gpu = self.ctx.local_rank if gpu is None and self.ctx.device.type == "cuda" else gpu
        from runner.producer_group import start_producers

        ids = self.producer_ids  # the same producer processes and flags as the TensorFlow trainer, a share per rank
        self.group = start_producers(self.cfg, endpoints, self.ctx.tmpdir, ids, [gpu] * len(ids), supervise=False)
        if self.group is not None and self.cfg.producer_kind == "dali":  # the rank's own GPU, or the CPU
            self.decoded_on = f"gpu {gpu} (dali producers)" if self.cfg.dali_device == "gpu" else "cpu (dali producers)"

    def check(self) -> None:
        """--on-producer-exit, as the TensorFlow trainer applies it (runner/producer_group.py `ProducerWatch`),
        over whichever group this rank started (a path may start its own kind: gpu-decode's read producers)."""
        if self.group is None:
            return
        if self.watch is None or self.watch.group is not self.group:
            from runner.producer_group import ProducerWatch

            self.watch = ProducerWatch(self.group, self.cfg.on_producer_exit, f"rank {self.ctx.rank}: ")
        self.watch.check()

    def stop_producers(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None
