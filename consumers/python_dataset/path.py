"""`python-dataset`: the framework's own dataset machinery pulls from the producers in Python."""

from __future__ import annotations

from core.registry import Declaration

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
        "torch": "the loader workers limit: use zmq-consume (native receive threads), or more producers",
    },
)
