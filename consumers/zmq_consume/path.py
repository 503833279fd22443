"""`zmq-consume`: native code receives each batch (no Python per batch); the path the benchmark exists for."""

from __future__ import annotations

from typing import Any

from consumers.fields import PRODUCER_FED
from core.errors import ConfigError
from core.registry import Declaration
from core.result_fields import ResultField, all_true, summed_each


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


# Over shm://: whether every rank's tensors were the slots themselves.
ZERO_COPY = ResultField(
    "zero_copy",
    {
        "type": "boolean",
        "description": "zmq-consume: the op's tensors were the shared-memory slots themselves (shm://, FEEDBENCH_ZERO_COPY unset or 1), not copies",
    },
    all_true,
)
# Slots registered with CUDA, or refused (then zero_copy is false), summed over the ranks.
CUDA_REGIONS = ResultField(
    "cuda_regions",
    {
        "type": "object",
        "description": "torch zmq-consume over shm:// on a GPU, summed over ranks: shared-memory regions registered with CUDA (cudaHostRegister) and refused; a refused region's batches are staged through pinned memory and zero_copy is false",
        "properties": {"registered": {"type": "integer", "minimum": 0}, "refused": {"type": "integer", "minimum": 0}},
        "required": ["registered", "refused"],
        "additionalProperties": False,
    },
    summed_each,
)

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
    fields=(*PRODUCER_FED, ZERO_COPY, CUDA_REGIONS),
)
