"""`python -m producers dali`: the same ImageNet input as `decode`, as an NVIDIA DALI pipeline.

Read → decode → random-resized crop → random flip, declared with
@pipeline_def. With --dali-device gpu the decoder runs on the GPU ("mixed")
and the crop there too; with cpu, DALI runs without a GPU (device_id=None).
Batches are copied to host memory and pushed by the same sender as every
other producer, so a consumer cannot tell the producers apart.

Each worker process (--workers) runs its own pipeline on its own shard of the
files; --dali-threads sets each pipeline's num_threads. DALI cannot skip a
bad file: one that does not decode stops the producer with DALI's error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.cli_types import positive_int
from core.images.dali import DaliMissingError, build_pipeline, import_dali
from core.images.files import DatasetError, list_images
from producers.decode import add_data_args, check_dataset
from producers.options import add_send_args, run_producer


def host_batch(pipe) -> tuple[np.ndarray, np.ndarray]:
    """Run the pipeline once; its outputs as numpy arrays the caller owns."""
    images, labels = pipe.run()
    if hasattr(images, "as_cpu"):
        images = images.as_cpu()
    # np.array copies: DALI reuses its output buffers, the sender must not see them change.
    return np.array(images.as_array()), np.array(labels.as_array()).reshape(-1)


@dataclass(frozen=True)
class DaliSource:
    """Batches from a DALI pipeline; picklable, each worker builds its own pipeline on its shard."""

    root: str
    list_file: str | None = None
    batch: int = 64
    image_size: int = 224
    workers: int = 1
    device: str = "cpu"
    threads: int = 1
    seed: int = 0
    device_id: int = 0

    def __call__(self, worker: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        # The same listing as the Python producer: same files, same class indices.
        files, labels, _ = list_images(self.root, self.list_file)
        pipe = build_pipeline(
            self.root,
            files,
            labels,
            self.batch,
            self.image_size,
            self.device,
            self.threads,
            worker,
            self.workers,
            self.seed,
            self.device_id,
        )
        while True:
            yield host_batch(pipe)

    def describe(self) -> str:
        return f"dali {self.device} {self.root} -> {self.batch}x{self.image_size}x{self.image_size}x3 uint8"


def _run(args: argparse.Namespace) -> int:
    try:
        import_dali()
        check_dataset(args.data, args.list, args.workers)
    except (DaliMissingError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    source = DaliSource(
        root=str(Path(args.data)),
        list_file=args.list,
        batch=args.batch,
        image_size=args.image_size,
        workers=args.workers,
        device=args.dali_device,
        threads=args.dali_threads,
        seed=args.seed,
        device_id=args.device_id,
    )
    return run_producer(source, args, source.describe())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dali", help="the decode producer's work as an NVIDIA DALI pipeline (optional extra)")
    add_send_args(p)
    add_data_args(p)
    p.add_argument(
        "--dali-device", choices=("cpu", "gpu"), default="cpu", help="decode on the CPU, or on the GPU (mixed)"
    )
    p.add_argument("--dali-threads", type=positive_int, default=1, help="DALI num_threads of each worker's pipeline")
    p.add_argument("--device-id", type=int, default=0, help="GPU of the pipelines with --dali-device gpu")
    p.set_defaults(func=_run)
