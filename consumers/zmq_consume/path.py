"""`zmq-consume`: native code receives each batch (no Python per batch); the path the benchmark exists for."""

from __future__ import annotations

from core.registry import Declaration

PATH = Declaration(
    name="zmq-consume",
    summary={
        "tf": "the native zmq_ops pull op in the graph (no Python per batch)",
        "torch": "native receive threads write batches into pinned memory; async copy to the device",
    },
    order=40,
    needs_producers=True,
    advice={
        "tf": "the pull op limits: check the wire format (native is one copy fewer) and --hwm",
        "torch": "the native receiver limits: check the wire format (native is one copy fewer) and --hwm",
    },
)
