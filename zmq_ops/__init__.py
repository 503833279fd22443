"""Tensors from ZMQ producers, natively: a TensorFlow op and a TF-free receiver.

`zmq_ops.ZMQPullSocket(end_point, types).pull()` gives a list of tensors
received from ZMQ PUSH producers (drop-in for tensorpack/zmq_ops);
`zmq_ops.dataset(...)` wraps it as a tf.data.Dataset; `dump_arrays` writes
the single-frame format that tensorpack's `send_dataflow_zmq(...,
format='zmq_ops')` sends. See docs/zmq_ops.md.

Importing this package, or `zmq_ops.receiver` (the TF-free receiver that
writes batches into caller-provided buffers, for PyTorch), does not import
TensorFlow: the op's names load `zmq_ops.tf_op` on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_TF_NAMES = {
    "ZMQPullSocket",
    "ZMQDataset",
    "dataset",
    "zmq_connection",
    "zmq_connection_stats",
    "zmq_pull",
}

__all__ = sorted([*_TF_NAMES, "dump_arrays"])


def __getattr__(name: str) -> Any:
    if name in _TF_NAMES:
        return getattr(importlib.import_module("zmq_ops.tf_op"), name)
    if name == "dump_arrays":
        from wire.zmqops_format import dump_arrays

        return dump_arrays
    raise AttributeError(f"module 'zmq_ops' has no attribute {name!r}")
