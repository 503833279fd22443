"""`python-queue`: a Python thread pulls from the producers into a queue the step reads from."""

from __future__ import annotations

from consumers.fields import PRODUCER_FED
from core.registry import Declaration

PATH = Declaration(
    name="python-queue",
    summary={
        "tf": "pyzmq in a Python thread feeding a TF FIFOQueue (tensorpack's QueueInput)",
        "torch": "a Python thread pulls from the producers into pinned memory, prefetched on a side stream",
    },
    order=20,
    needs_producers=True,
    advice={
        "tf": "the Python receive loop limits: use zmq-consume (the native op) or more consumer threads",
        "torch": "the Python receive loop limits: use zmq-consume (native receive threads)",
    },
    fields=PRODUCER_FED,
)
