"""`python-dataset`: the framework's own dataset machinery pulls from the producers in Python."""

from __future__ import annotations

from typing import Any

from consumers.fields import PRODUCER_FED
from core.errors import ConfigError
from core.registry import Declaration


def workers_fed(cfg: Any) -> None:
    """Each DataLoader worker binds an endpoint of its own: it needs at least one producer to feed it."""
    if cfg.dataset_workers is not None and cfg.dataset_workers > cfg.producers:
        raise ConfigError(
            f"--dataset-workers {cfg.dataset_workers}: more loader workers than producers (--producers "
            f"{cfg.producers}); each worker needs a producer of its own to feed it"
        )


def in_process(cfg: Any) -> None:
    """TensorFlow's python-dataset pulls in the trainer's own process: it has no loader workers to set."""
    if cfg.dataset_workers is not None:
        raise ConfigError(
            "--dataset-workers: PyTorch's python-dataset only; TensorFlow's pulls inside tf.data, in the trainer"
        )


PATH = Declaration(
    name="python-dataset",
    summary={
        "tf": "pyzmq inside tf.data's from_generator, prefetched",
        "torch": "DataLoader workers pull from the producers (IterableDataset), pin_memory, async copy",
    },
    order=30,
    needs_producers=True,
    advice={
        "tf": "the Python generator limits: use zmq-consume (the native op)",
        "torch": "the loader workers limit: use zmq-consume (native receive threads), or more producers and "
        "--dataset-workers",
    },
    checks={"torch": workers_fed, "tf": in_process},
    fields=PRODUCER_FED,
)
