"""`zmq-consume`: batches enter the graph through the native zmq_ops pull op (tensorpack's ZMQInput).

No Python runs per batch: the op's kernel receives on its own thread and
copies each frame once into a tensor. This is the path the benchmark exists
to measure. The connection binds, so any number of producers can connect.
The op counts what each producer delivered (sequence numbers), read by a
callback of this path; the producers' own figures come from their stats files.
"""

from __future__ import annotations

import time

from tensorpack.callbacks import Callback
from tensorpack.input_source import InputSource, TensorInput, ZMQInput

from consumers.accounting import native_rows
from consumers.tf_expected import ensure_batch
from consumers.tf_half import TFInputPath
from consumers.zmq_consume.path import PATH
from core.registry import register
from frameworks.tf_env import import_tf

tf = import_tf()


class PullInput(ZMQInput):
    """tensorpack's ZMQInput with a receive timeout, a message-size cap and CURVE keys, pulling on the CPU."""

    def __init__(
        self,
        endpoint: str,
        hwm: int,
        timeout_ms: int,
        max_msg_size: int,
        specs: list,
        curve_keys: str | None = None,
    ) -> None:
        super().__init__(endpoint, hwm, bind=True)
        self.timeout_ms = timeout_ms
        self.max_msg_size = max_msg_size
        self.curve_keys = curve_keys
        self.socket = None
        pull = self.get_tensor_fn

        def on_cpu() -> list:
            with tf.device("/cpu:0"):
                # The op checks each message's count and dtypes; a batch of another shape fails here,
                # on the host, before it is staged.
                return ensure_batch(pull(), specs)

        self.get_tensor_fn = on_cpu

    def _setup(self, input_signature) -> None:
        import zmq_ops  # the op library is built by `make op`; import it only when this path runs

        # TensorInput's setup; ZMQInput's own would make a socket without the timeout, the cap and the keys.
        TensorInput._setup(self, input_signature)
        self.socket = self._zmq_pull_socket = zmq_ops.ZMQPullSocket(
            self._end_point,
            [s.dtype for s in input_signature],
            hwm=self._hwm,
            bind=True,
            timeout_ms=self.timeout_ms,
            max_msg_size=self.max_msg_size,
            curve_keys=self.curve_keys,
        )


class ConnectionStats(Callback):
    """Reads the op's counters (per producer, from sequence numbers) when training ends.

    Telemetry reads them through `read` as well, between steps, for the wire's rates.
    """

    def __init__(self, source: PullInput) -> None:
        self.source = source
        self.producers: list[dict] = []
        self.messages = 0

    def _setup_graph(self) -> None:
        self._stats = self.source.socket.stats()

    def read(self, session) -> tuple[list[dict], int, int]:
        """Per-producer rows, and the messages and bytes received so far."""
        rows, totals = session.run(self._stats)
        return native_rows(rows), int(totals[0]), int(totals[1])

    def _after_train(self) -> None:
        if getattr(self.trainer.sess, "_closed", False):  # a failed input closed it: the run reports why
            return
        self.producers, self.messages, _ = self.read(self.trainer.sess)


@register
class ZmqConsume(TFInputPath):
    declaration = PATH
    input_op_types = frozenset({"ZMQPull"})

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        c = self.cfg
        self.source = PullInput(
            self.endpoint,
            c.hwm,
            -1 if c.recv_timeout is None else int(c.recv_timeout * 1000),
            -1 if c.max_msg_size is None else int(c.max_msg_size),
            specs,
            c.curve_keys,
        )
        self.stats = ConnectionStats(self.source)
        return self.source

    def callbacks(self) -> list[Callback]:
        return [self.stats]

    def counters(self, session=None) -> dict | None:
        # A run of its own (not a fetch of the training step), so the counters are read
        # exactly between steps; it costs well under a millisecond, twice per run.
        rows, messages, nbytes = self.stats.read(session)
        return {
            "time": time.perf_counter(),
            "messages": messages,
            "bytes": nbytes,
            "latency_s": None,  # the op does not time its messages
            "wait_s": None,
            "received": {r["producer"]: r["received"] for r in rows},
            "source": "zmq_ops connection counters",
        }

    def result_fields(self) -> dict:
        # Every batch the op accepted: the steps' batches plus one staged per device, ahead.
        fields = {"producers": self.stats.producers, "batches_pulled": self.stats.messages}
        if self.source.socket is not None:  # over shm://: whether the op's tensors were the slots or copies
            fields["zero_copy"] = self.source.socket.zero_copy
            if self.source.socket.zero_copy:  # registered with CUDA where TensorFlow has a GPU: say what happened
                from zmq_ops.tf_op import cuda_regions

                regions = cuda_regions()
                if regions["registered"] or regions["refused"]:
                    fields["cuda_regions"] = regions
                    fields["zero_copy"] = regions["refused"] == 0
        return fields
