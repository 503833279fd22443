"""The ImageNet training input as an NVIDIA DALI pipeline: read, decode, random-resized crop, random flip.

The `dali` producer runs it in its worker processes and the in-trainer dali
paths of both frameworks in the trainer, so the images are the same
wherever it runs. DALI itself imports neither TensorFlow nor PyTorch.
"""

from __future__ import annotations

INSTALL_HINT = "pip install -e '.[dali]'  (or: .venv/bin/pip install nvidia-dali-cuda120)"


class DaliMissingError(ImportError):
    """nvidia.dali cannot be imported; the message says how to install it."""


def import_dali():
    """The nvidia.dali package, or DaliMissingError with the install command."""
    try:
        import nvidia.dali as dali
    except ImportError as e:
        raise DaliMissingError(f"NVIDIA DALI is not installed ({e}); install it with: {INSTALL_HINT}") from None
    return dali


def build_pipeline(
    root: str,
    files: list[str],
    labels: list[int],
    batch: int,
    image_size: int,
    device: str = "cpu",
    num_threads: int = 1,
    shard_id: int = 0,
    num_shards: int = 1,
    seed: int = 0,
    device_id: int = 0,
):
    """A built DALI pipeline whose outputs are (uint8 NHWC images, int32 labels)."""
    dali = import_dali()
    from nvidia.dali import fn, types

    @dali.pipeline_def(
        batch_size=batch,
        num_threads=num_threads,
        device_id=device_id if device == "gpu" else None,  # None: CPU-only mode, no GPU needed
        seed=seed * 1000 + shard_id + 1,
        prefetch_queue_depth=2,
    )
    def imagenet_train():
        jpegs, label = fn.readers.file(
            file_root=root,
            files=files,
            labels=labels,
            random_shuffle=True,
            shard_id=shard_id,
            num_shards=num_shards,
            name="reader",
        )
        images = fn.decoders.image(jpegs, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)
        images = fn.random_resized_crop(
            images, size=(image_size, image_size), random_area=(0.08, 1.0), random_aspect_ratio=(3 / 4, 4 / 3)
        )
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, fn.cast(label, dtype=types.INT32)

    pipe = imagenet_train()
    pipe.build()
    return pipe
