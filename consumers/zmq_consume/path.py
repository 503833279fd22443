"""`zmq-consume`: native code receives each batch (no Python per batch); the path the benchmark exists for."""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError
from core.registry import Declaration


def receiver_module() -> Any:
    """zmq_ops.receiver, the PyTorch half's native receiver (framework-free), or a ConfigError saying why not."""
    try:
        from zmq_ops import receiver
    except ImportError as e:
        raise ConfigError(f"--fake-location zmq-consume: the native receiver is not available ({e})") from None
    return receiver


def receiver_builds(cfg: Any) -> None:
    """The PyTorch half's native receiver is built (here, once, if missing or stale), before the ranks start."""
    try:
        receiver_module().library()
    except Exception as e:
        raise ConfigError(f"--fake-location zmq-consume: the native receiver does not build: {e}") from None


PATH = Declaration(
    name="zmq-consume",
    summary={
        "tf": "the native zmq_ops pull op in the graph (no Python per batch)",
        "torch": "native receive threads write batches into pinned memory; async copy to the device",
    },
    order=40,
    needs_producers=True,
    checks={"torch": receiver_builds},
    advice={
        "tf": "the pull op limits: check the wire format (native is one copy fewer) and --hwm",
        "torch": "the native receiver limits: check the wire format (native is one copy fewer) and --hwm",
    },
)
