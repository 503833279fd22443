"""`tf-data-service`: the tf.data service's workers make the batches; the trainer reads them over gRPC.

The pipeline is built here, in the trainer's graph, and `distribute` sends it
to the dispatcher, which has every worker run it (`off`: each worker the
whole source; `dynamic`: the dispatcher hands out its elements, each once).
It does the producers' work: synthetic batches laid out from a few cached
tiles, the JPEGs of --data decoded with an Inception crop and flip, or the
user's --loader tf.data pipeline (one built from TensorFlow ops: the workers
have no Python of the trainer's to call). Each batch carries (stream, seq)
as a producer's header does: `stream` is drawn once per worker pass, `seq`
is the batch's index in the source (a loader's: in the worker's pass), so
the trainer counts what each worker delivered, and what was lost or came
twice (consumers/accounting.py `StreamTracker`), in a small Python call per
batch.
Compression is off: pixels do not compress, and the workers would pay for it.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

import numpy as np
from tensorpack.callbacks import Callback
from tensorpack.input_source import InputSource, TFDatasetInput

from consumers.accounting import StreamTracker
from consumers.tf_data_service.path import PATH
from consumers.tf_half import TFInputPath
from consumers.tf_loader import fitted, python_calls
from core import loader_processes
from core.errors import InputError
from core.images.files import DatasetError, list_images
from core.loader_spec import ELSEWHERE, LoaderError, LoaderSpec, kind_of, returned_words
from core.registry import register
from frameworks.tf_env import import_tf
from profiler.cpu import tree_cpu_seconds
from profiler.telemetry import delivered_figures
from runner.data_service import ServiceGroup, worker_use

tf = import_tf()

PREFETCH = 2
NOT_CHECKED = (
    "each source element handed to one worker only: a --loader's batches are numbered in each worker's pass "
    "(checked there, in producers), not in its source"
)
TILES = 8  # cached source images, as the synthetic producers lay their batches out (producers/synthetic.py)
ENDLESS = 2**62  # the source's length: the run ends it, not the source


# Graph code as written, not converted by AutoGraph: nothing here branches on a tensor, and AutoGraph would
# leave its generated files in TMPDIR when a signal ends the run.
_plain = tf.autograph.experimental.do_not_convert


def _stamped(numbered):
    """(seq, (images, labels)) -> (images, labels, stream, seq): stream drawn at a worker pass's first batch."""

    @_plain
    def step(stream, element):
        seq, (images, labels) = element
        # Seeds 0, 0: the kernel seeds itself from the OS, in each worker (a graph-level seed would give
        # every worker the same id).
        low, high = tf.constant(0, tf.int64), tf.constant(ENDLESS, tf.int64)
        drawn = tf.raw_ops.RandomUniformInt(shape=tf.zeros([0], tf.int32), minval=low, maxval=high, seed=0, seed2=0)
        stream = tf.where(stream < 0, drawn, stream)
        return stream, (images, labels, stream, seq)

    return numbered.scan(tf.constant(-1, tf.int64), step)


def numbered(source) -> tf.data.Dataset:
    """A built-in source's batches, each with its index in the source: batch `seq` is `source(seq)`."""
    return tf.data.Dataset.range(ENDLESS).map(_plain(lambda seq: (seq, source(seq))))


def user_pipeline(cfg: Any, images_spec, labels_spec) -> tf.data.Dataset:
    """The user's --loader tf.data pipeline, made here once (shard 0 of 1: the service shares it between its
    workers) and repeated, each batch with its index in a worker's pass. LoaderError, before the service
    starts, for a loader whose pipeline the workers cannot run: anything but a tf.data.Dataset, or one that
    calls back into this process's Python."""
    spec = LoaderSpec.parse(cfg.loader, cfg.loader_arg)
    offer = {"batch_size": int(images_spec.shape[0]), "image_size": int(images_spec.shape[1])}
    graph = tf.compat.v1.get_default_graph()  # the helper thread builds the dataset into the model's graph
    ds = spec.build(0, 0, 1, offer, timeout=cfg.loader_timeout, context=graph.as_default)
    why = None
    if kind_of(ds) != "tf.data":
        why = f"it returns {returned_words(ds)}, not a tf.data.Dataset"
    elif calls := python_calls(ds):
        why = f"its tf.data pipeline calls Python ({', '.join(calls)})"
    if why is not None:
        loader_processes.stop_started()  # what the callable started: a refusal while building skips `close`
        raise LoaderError(
            f"loader {spec.name}: {why}; the tf.data service's workers run the pipeline's graph in processes of "
            "their own, without this process's Python: build it from TensorFlow ops only (tf.io, tf.image, "
            f"Dataset.map of TensorFlow functions), or {ELSEWHERE}"
        )
    return fitted(spec, ds, images_spec, labels_spec).repeat().enumerate()


def synthetic(batch: int, size: int, label_dtype):
    """The synthetic producers' batches (producers/synthetic.py): rotations of a few cached random tiles."""
    rng = np.random.default_rng([0, 0])
    tiles = tf.constant(rng.integers(0, 256, (TILES, size, size, 3), dtype=np.uint8))
    labels = tf.constant(rng.integers(0, 1000, (TILES, batch)), dtype=label_dtype)

    @_plain
    def source(seq):
        k = tf.math.floormod(seq, TILES)
        return tf.gather(tiles, tf.math.floormod(k + tf.range(batch, dtype=tf.int64), TILES)), labels[k]

    return source


def decoded(folder: str, batch: int, size: int, label_dtype):
    """The decode producers' work (producers/decode.py) in tf.image: read, random-resized crop, flip, resize."""
    try:
        files, labels, _ = list_images(folder)
    except DatasetError as e:
        raise InputError(f"{PATH.name}: {e}") from None
    root = os.path.abspath(folder)  # the workers read the files themselves: on other hosts, at the same place
    files_t = tf.constant([os.path.join(root, f) for f in files])
    labels_t = tf.constant(labels, dtype=label_dtype)
    n = len(files)

    @_plain
    def one(path):
        data = tf.io.read_file(path)
        box = tf.image.sample_distorted_bounding_box(
            tf.image.extract_jpeg_shape(data), tf.zeros([0, 0, 4]), area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3), use_image_if_no_bounding_boxes=True,
        )  # fmt: skip
        y, x, _ = tf.unstack(box[0])
        h, w, _ = tf.unstack(box[1])
        image = tf.image.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3)
        image = tf.image.random_flip_left_right(tf.image.resize(image, [size, size]))
        return tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8)

    @_plain
    def source(seq):
        idx = tf.math.floormod(seq * batch + tf.range(batch, dtype=tf.int64), n)
        images = tf.map_fn(one, tf.gather(files_t, idx), fn_output_signature=tf.uint8)
        return tf.ensure_shape(images, [batch, size, size, 3]), tf.gather(labels_t, idx)

    return source


@register
class TFDataService(TFInputPath):
    declaration = PATH
    input_op_types = frozenset({"IteratorGetNext"})

    def __init__(self, cfg, endpoint: str | None = None) -> None:
        super().__init__(cfg, endpoint)
        self.service: ServiceGroup | None = None
        self.address = cfg.dispatcher
        # A loader's batches are numbered in each worker's pass (its source is its own): counted per pass.
        self.tracker = StreamTracker(shared=cfg.service_mode == "dynamic" and cfg.producer_kind != "loader")
        self.batch_bytes = 0
        self.last_batch = time.monotonic()
        self._failure: str | None = None
        self._window: tuple[dict, dict] | None = None
        self.gone: dict[int, int] = {}  # a process of the run's own service that exited -> batches received by then

    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        cfg = self.cfg
        images, labels = specs[0], specs[1]
        batch, size = int(images.shape[0]), int(images.shape[1])
        if cfg.producer_kind == "loader":
            pipeline = user_pipeline(cfg, images, labels)
        elif cfg.producer_kind == "decode":
            pipeline = numbered(decoded(cfg.data, batch, size, labels.dtype))
        else:
            pipeline = numbered(synthetic(batch, size, labels.dtype))
        if not cfg.dispatcher:  # the run's own service: its ports are chosen now, its processes start in `open`
            self.service = ServiceGroup(cfg.service_workers, cfg.on_producer_exit)
            self.address = self.service.address
        self.batch_bytes = images.shape.num_elements() * images.dtype.size + labels.shape.num_elements() * 4 + 16
        policy = tf.data.experimental.service.ShardingPolicy
        mode = policy.DYNAMIC if cfg.service_mode == "dynamic" else policy.OFF
        with warnings.catch_warnings():  # distribute reads the dataset's options, which graph mode warns about
            warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
            service = tf.data.experimental.service.distribute(mode, self.address, compression=None)
            ds = _stamped(pipeline).apply(service)
        return TFDatasetInput(tf.compat.v1.data.Dataset.zip((ds,)).map(self._counted).prefetch(PREFETCH))

    @_plain
    def _counted(self, element):
        images, labels, stream, seq = element

        def count(stream, seq):
            self.tracker.add(int(stream), int(seq))
            self.last_batch = time.monotonic()
            return np.int64(0)

        done = tf.numpy_function(count, [stream, seq], tf.int64, stateful=True)
        with tf.control_dependencies([done]):
            return tf.identity(images), labels

    # --- running ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Start the run's own dispatcher and workers, and wait until each listens."""
        if self.service is not None and not self.service.procs:
            self.producers = self.service.start()
            self.service.wait_ready(self.cfg.recv_timeout)

    def callbacks(self) -> list[Callback]:
        return [_Silence(self)]

    def counters(self, session=None) -> dict:
        received = {pid: c.received for pid, c in self.tracker.producers.items()}
        n = sum(received.values())
        procs = self.service.procs if self.service is not None else []
        return {
            "time": time.perf_counter(),
            "messages": n,
            "bytes": n * self.batch_bytes,
            "latency_s": None,
            "wait_s": None,
            "received": received,
            "cpu_s": [tree_cpu_seconds(p.pid) for p in procs],
            "source": "tf.data service client (payload bytes, uncompressed)",
        }

    def producer_figures(self, window: tuple[dict, dict] | None) -> dict | None:
        """Each worker pass's delivered rate over the measured steps (exact: the batches' own stamps)."""
        self._window = window
        if window is None or not self.tracker.producers:
            return None
        w0, w1 = window
        return delivered_figures(self.tracker.producers, w0["received"], self.cfg.batch, w1["time"] - w0["time"])

    def result_fields(self) -> dict:
        out = {"producers": self.tracker.table(), "service": self._service()}
        ended = self.tracker.ended(len(self.gone), max(self.gone.values())) if self.gone else []
        if self.gone:  # --on-producer-exit continue: who left, and the passes that ended with them
            out["service"]["exited"] = list(self.service.exited().values()) if self.service is not None else []
            out["service"]["streams_ended"] = ended
        overall = self.tracker.overall(ended)
        if overall is not None:
            out["service"]["delivered"] = overall
        return out

    def note_exits(self) -> None:
        """Note each of the run's own service processes that has exited, with the batches received by then: a
        pass silent since is one that ended with it (`StreamTracker.ended`)."""
        if self.service is not None and self.service.procs:
            for i in self.service.exited():
                self.gone.setdefault(i, self.tracker.arrivals)

    def _service(self) -> dict:
        """Where the service is, and (its own, started here) each process's CPU over the timed steps."""
        cfg = self.cfg
        out = {"dispatcher": self.address, "mode": cfg.service_mode, "started_here": self.service is not None}
        if cfg.producer_kind == "loader" and cfg.service_mode == "dynamic":
            out["not_checked"] = NOT_CHECKED
        if self.service is not None and self._window is not None:
            out.update(worker_use(self._window, self.service.workers))
        return out

    def describe(self) -> dict:
        """Who makes the batches: the service's workers, for the verdict's advice when they limit."""
        out = super().describe()
        who = f"{self.cfg.service_workers} workers of" if self.service is not None else "the workers of"
        what = f", running loader {self.cfg.loader}" if self.cfg.producer_kind == "loader" else ""
        out["batch_maker"] = {"kind": "external", "name": f"the tf.data service ({who} {self.address}{what})"}
        return out

    def failure(self) -> str | None:
        return self._failure

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.cfg.producer_kind == "loader":  # what its callable started (a cache server), as the loader path does
            loader_processes.say_left(self.cfg.loader, loader_processes.stop_started())


class _Silence(Callback):
    """Ends the run with one line naming the dispatcher when no batch comes within --recv-timeout.

    The tf.data service's client waits for its workers for ever; this watches
    the batches' own arrival and closes the session, which cancels the step.
    On the way it notes which of the run's own service processes have exited
    (with --on-producer-exit continue the run goes on without them).
    """

    def __init__(self, path: TFDataService) -> None:
        self.path = path
        self._done = threading.Event()

    def _before_train(self) -> None:
        self.path.last_batch = time.monotonic()
        threading.Thread(target=self._watch, name="feedbench-service-watch", daemon=True).start()

    def _watch(self) -> None:
        limit = self.path.cfg.recv_timeout
        while not self._done.wait(0.2):
            self.path.note_exits()
            if time.monotonic() - self.path.last_batch > limit:
                self.path._failure = f"no batch from the tf.data service at {self.path.address} within {limit:g} s"
                self.trainer.sess.close()
                return

    def _after_train(self) -> None:
        self._done.set()
        self.path.note_exits()
