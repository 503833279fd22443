"""`spdl`: a current loader for reference, SPDL's pipeline decoding the JPEG folder in the trainer process.

SPDL (Meta's Scalable and Performant Data Loading) runs each stage of a
pipeline on a thread pool with its own concurrency: here list -> read and
decode (`--dali-threads` at once) -> batch, then the pinned-memory,
side-stream feeder of python-queue. The decode is feedbench's own
(simplejpeg with the same random-resized crop and flip as the decode
producer): spdl.io's FFmpeg decoders need FFmpeg's shared libraries, which
the spdl wheel does not bring, and the same decode keeps the comparison about
the loader. Each rank decodes its own shard of the files.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from consumers.spdl.path import PATH
from consumers.torch_half import RankContext, TorchInputPath, labels_of
from core.errors import InputError
from core.registry import register
from feeders.torch import Prefetcher
from frameworks.torch_trace import stage
from profiler.telemetry import DescribedStage


@register
class Spdl(TorchInputPath):
    declaration = PATH

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        from spdl.pipeline import PipelineBuilder

        from core.images.files import list_images

        cfg = self.cfg
        files, labels, _ = list_images(cfg.data, None)
        shard = list(range(ctx.rank, len(files), ctx.world)) or list(range(len(files)))
        root = Path(cfg.data)
        size = cfg.image_size

        skipped: set[int] = set()  # files that are not JPEGs: named once, never sent again
        load = _loader(files, labels, root, size, shard, skipped, ctx.rank)

        def indices():
            for epoch in range(1 << 62):
                order = [i for i in shard if i not in skipped]
                random.Random(f"{ctx.rank}/{epoch}").shuffle(order)
                yield from order

        def collate(items: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
            return [np.stack([im for im, _ in items]), np.array([lb for _, lb in items], np.int32)]

        threads = max(1, cfg.dali_threads or 1)
        self.pipeline = (
            PipelineBuilder()
            .add_source(indices())
            .pipe(load, concurrency=threads)
            .aggregate(cfg.batch, drop_last=True)
            .pipe(collate)
            .add_sink(buffer_size=2)
            .build(num_threads=threads + 1)
        )
        self.pipeline.start()
        pipeline = self.pipeline
        self.prefetch = Prefetcher(
            lambda: pipeline.get_iterator(timeout=cfg.recv_timeout), ctx.device, depth=2, name="spdl",
            source_stage="feedbench.load",
        )  # fmt: skip

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self.prefetch.next()
        return images, labels_of(labels)

    def sampled_stages(self) -> list:
        return [
            DescribedStage(
                "decoder", {"kind": "simplejpeg in an SPDL pipeline", "threads": max(1, self.cfg.dali_threads or 1)}
            )
        ]

    def result_fields(self) -> dict:
        return {"batches_pulled": self.prefetch.batches}

    def close(self) -> None:
        self.pipeline.stop(timeout=10)
        self.prefetch.close()


def _loader(files: list, labels: list, root: Path, size: int, shard: list[int], skipped: set[int], rank: int):
    """SPDL's per-image task: file `i` decoded and cropped into a new array, with its label.

    A file that is not a JPEG is skipped as the decode producers skip it, with one line naming it, and the next
    file of the shard takes its place: a batch is never shorter, and SPDL logs no failed task for it.
    """
    from core.images.decoders import DECODERS, DEFAULT_DECODER, NotJpegError

    decode = DECODERS[DEFAULT_DECODER]

    def load(i: int) -> tuple[np.ndarray, int]:
        out = np.empty((size, size, 3), np.uint8)
        for _ in range(len(shard)):
            try:
                with stage("feedbench.decode"):  # on SPDL's thread pool
                    decode((root / files[i]).read_bytes(), random.Random(i), out)
                return out, labels[i]
            except NotJpegError as e:
                if i not in skipped:
                    skipped.add(i)
                    print(f"  warning: rank {rank}: skipping {root / files[i]}: {e}", flush=True)
                i = shard[(shard.index(i) + 1) % len(shard)]
        raise InputError(f"no file of rank {rank}'s share of {root} is a JPEG")

    return load
