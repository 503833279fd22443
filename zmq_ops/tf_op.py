"""The TensorFlow op: tensors from a ZMQ socket (drop-in for tensorpack/zmq_ops).

`ZMQPullSocket(end_point, types).pull()` gives a list of tensors received from
ZMQ PUSH producers; `dump_arrays` writes the single-frame format that
tensorpack's `send_dataflow_zmq(..., format='zmq_ops')` sends. The op also
reads feedbench's native multipart format (docs/wire.md), which saves the
sender a copy. Works in eager and graph mode; see docs/zmq_ops.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

from wire.zmqops_format import dump_arrays  # noqa: E402
from zmq_ops.build import library_path  # noqa: E402

__all__ = [
    "ZMQDataset",
    "ZMQPullSocket",
    "cuda_regions",
    "dataset",
    "dump_arrays",
    "zmq_connection",
    "zmq_connection_stats",
    "zmq_pull",
]


def _load_library():
    path = library_path()
    if not path.exists():
        raise ImportError(
            f"the zmq_ops op library {path.name} is not built: run `make op` "
            "(or `pip install --no-build-isolation -e .`) in the feedbench checkout"
        )
    try:
        return tf.load_op_library(str(path))
    except Exception as e:  # tf raises NotFoundError for a library built for another TensorFlow
        raise ImportError(
            f"cannot load {path}: {e}\nIt was probably built for another TensorFlow; rebuild it with `make op`."
        ) from e


def zero_copy_default() -> bool:
    """Zero-copy outputs unless FEEDBENCH_ZERO_COPY=0 asks for the copying path."""
    return os.environ.get("FEEDBENCH_ZERO_COPY", "1").strip().lower() not in ("0", "false", "no", "off")


_ops = _load_library()


def cuda_regions() -> dict[str, int]:
    """shm:// regions this process registered with CUDA so far, and those CUDA refused (copied from pageable
    memory): {"registered": n, "refused": m}. Both 0 where TensorFlow loaded no CUDA runtime."""
    import ctypes

    out = (ctypes.c_int64 * 2)()
    ctypes.CDLL(str(library_path())).fb_tf_cuda_regions(out)
    return {"registered": int(out[0]), "refused": int(out[1])}


zmq_connection = _ops.zmq_connection
zmq_pull = _ops.zmq_pull
zmq_connection_stats = _ops.zmq_connection_stats


class ZMQPullSocket:
    """A ZMQ PULL socket in the graph; each `pull()` receives one message.

    Same signature as tensorpack/zmq_ops (what tensorpack's ZMQInput calls),
    plus `timeout_ms` (a pull that waits longer fails with DeadlineExceeded;
    -1 waits forever) and `max_msg_size` (bytes per frame; a peer sending
    more is disconnected, so it cannot make us allocate without bound), and
    `curve_keys` (a `python -m producers make-keys` folder: CURVE encryption,
    and only producers holding the folder's client key are admitted).

    `zero_copy` (default: on, unless FEEDBENCH_ZERO_COPY=0): from shm://
    producers, the pulled tensors' buffers are the producers' slots, handed
    back when TensorFlow drops them; off, each batch is copied into new
    tensors. `zero_copy` says which one ran (always False off shm://).
    """

    def __init__(
        self,
        end_point: str,
        types: Sequence[tf.dtypes.DType],
        hwm: int | None = None,
        bind: bool = True,
        name: str | None = None,
        timeout_ms: int = -1,
        max_msg_size: int = -1,
        curve_keys: str | os.PathLike | None = None,
        zero_copy: bool | None = None,
    ) -> None:
        if not isinstance(bind, bool):
            raise TypeError(f"bind must be a bool, got {bind!r}")
        self._types = [tf.as_dtype(t) for t in types]
        self._end_point = end_point
        self._zero_copy = zero_copy_default() if zero_copy is None else bool(zero_copy)
        self._name = name if name is not None else tf.compat.v1.get_default_graph().unique_name(type(self).__name__)
        self._handle = zmq_connection(
            end_point,
            hwm,
            bind=bind,
            timeout_ms=int(timeout_ms),
            max_msg_size=int(max_msg_size),
            curve_keys=os.fspath(curve_keys) if curve_keys else "",
            shared_name=self._name,
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def handle(self) -> tf.Tensor:
        """The connection's resource handle; more zmq_pull ops may share it."""
        return self._handle

    @property
    def zero_copy(self) -> bool:
        """True when pulls from this socket return tensors over the producers' slots (shm://, zero-copy on)."""
        return self._zero_copy and self._end_point.startswith("shm://")

    @property
    def end_point(self) -> str:
        return self._end_point

    @property
    def types(self) -> list[tf.dtypes.DType]:
        return list(self._types)

    def pull(self) -> list[tf.Tensor]:
        """One message's tensors, with the dtypes given at construction."""
        return zmq_pull(self._handle, self._types, zero_copy=self._zero_copy)

    def stats(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The connection's counters: int64 rows of (producer_id, received, lost, duplicated,
        restarts) from native headers' sequence numbers, and (messages, bytes) accepted."""
        return zmq_connection_stats(self._handle)


def dataset(
    end_point: str,
    types: Sequence[tf.dtypes.DType],
    shapes: Sequence[Sequence[int | None] | None] | None = None,
    hwm: int | None = None,
    bind: bool = True,
    timeout_ms: int = -1,
    max_msg_size: int = -1,
    num_parallel_calls: int | None = None,
    name: str | None = None,
    curve_keys: str | os.PathLike | None = None,
    zero_copy: bool | None = None,
) -> tf.data.Dataset:
    """An endless tf.data.Dataset whose elements are the tuples the op pulls.

    `shapes` (optional) pins static shapes so later stages can batch or
    place them. In graph mode use an initializable iterator (the dataset
    captures the socket's resource handle). Stops with DeadlineExceeded when
    `timeout_ms` passes without a message.
    """
    sock = ZMQPullSocket(end_point, types, hwm=hwm, bind=bind, name=name, timeout_ms=timeout_ms,
                         max_msg_size=max_msg_size, curve_keys=curve_keys, zero_copy=zero_copy)  # fmt: skip
    static = list(shapes) if shapes is not None else [None] * len(sock.types)
    if len(static) != len(sock.types):
        raise ValueError(f"{len(static)} shapes given for {len(sock.types)} types")

    def pull(_: tf.Tensor) -> tuple[tf.Tensor, ...]:
        out = sock.pull()
        for t, shape in zip(out, static, strict=True):
            if shape is not None:
                t.set_shape(shape)
        return tuple(out)

    return tf.data.Dataset.from_tensors(0).repeat().map(pull, num_parallel_calls=num_parallel_calls)


ZMQDataset = dataset
