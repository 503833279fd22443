"""Run one input path end to end: producers, input, towers, measured training, clean stop."""

from __future__ import annotations

import logging
import os
import re
import tempfile

from tensorpack.callbacks import Callback, RunUpdateOps
from tensorpack.tfutils.sesscreate import NewSessionCreator
from tensorpack.tfutils.sessinit import JustCurrentSession
from tensorpack.tfutils.tower import get_current_tower_context
from tensorpack.train import SyncMultiGPUTrainerParameterServer, SyncMultiGPUTrainerReplicated

from consumers.constant import cpu_synthetic_input, on_device_input
from consumers.python_feed import PullFlow, python_dataset_input, python_queue_input
from consumers.zmq_op import zmq_op_input
from feeders.staging import stage_onto_devices
from profiler.progress import RunProgress
from profiler.telemetry import Telemetry
from profiler.tracing import ProfileSteps
from trainer import devices, shutdown
from trainer.config import BenchConfig
from trainer.input_only import InputOnlyModel
from trainer.measure import COST_COLLECTION, StepTimer, summarize
from trainer.producer_group import ProducerDied, ProducerGroup, producer_command
from trainer.tf_env import tf
from wire import shm

tf = tf()


class _Quiet(logging.Filter):
    """Drop tensorpack lines that mislead here: GPU warnings where towers on CPU are intended, and
    its failure record (malformed, it prints a logging traceback; the run reports the error itself)."""

    NOISE = (
        "Training failed at global_step",
        "non-trainable",  # batch-norm statistics live on the first tower only, as in tensorpack's BatchNorm
        "not built with CUDA",
        "GPU",
        "gpu_device",
        "To workaround",
        "Avoid initializing",
        "Typically",
        "Manually set",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in str(record.msg) for n in self.NOISE)


_log = logging.getLogger("tensorpack")
_log.setLevel(logging.WARNING)
_log.addFilter(_Quiet())


class InputError(RuntimeError):
    """The input path could not deliver the batches the run needed; the message says which and why."""


class _WatchProducers(Callback):
    """Notices a dead producer at the next step, instead of waiting for a receive timeout.

    With `on_exit="stop"` the run fails naming it; with "continue" it says so
    once and trains on with the others, failing only when none is left.
    """

    def __init__(self, group: ProducerGroup, on_exit: str) -> None:
        self.group = group
        self.on_exit = on_exit
        self.reported: set[int] = set()

    def _trigger_step(self) -> None:
        if self.on_exit == "stop":
            self.group.check()
            return
        for i, message in self.group.exited().items():
            if i not in self.reported:
                self.reported.add(i)
                print(f"  warning: {message}; continuing with the other producers", flush=True)
        if len(self.reported) == len(self.group.procs):
            self.group.check()


class _ConnectionStats(Callback):
    """Reads the zmq op's counters (per producer, from sequence numbers) when training ends.

    Telemetry reads them through `read` as well, between steps, for the wire's rates.
    """

    def __init__(self, sock) -> None:
        self.sock = sock
        self.producers: list[dict] = []
        self.messages = 0

    def _setup_graph(self) -> None:
        self._stats = self.sock.stats()

    def read(self, session) -> tuple[list[dict], int, int]:
        """Per-producer rows, and the messages and bytes received so far."""
        rows, totals = session.run(self._stats)
        keys = ("producer", "received", "lost", "duplicated", "restarts")
        return [dict(zip(keys, map(int, row), strict=True)) for row in rows], int(totals[0]), int(totals[1])

    def _after_train(self) -> None:
        self.producers, self.messages, _ = self.read(self.trainer.sess)


def expected_message_size(batch: int, image_size: int) -> int:
    """The receive cap: the largest frame a producer should send, with a margin.

    A peer that sends more is cut off by ZMQ (ZMQ_MAXMSGSIZE) before the
    receiver allocates for it.
    """
    return int((batch * image_size * image_size * 3 + batch * 4) * 1.25) + 64 * 1024


_ROOT_ERROR = re.compile(r"^\(\d+\) [A-Z_]+: *(.+)$")


def op_message(e: Exception) -> str:
    """The op's own words from a TensorFlow error, without the graph-execution preamble.

    With several towers one failure can surface as several root errors,
    "(0) DEADLINE_EXCEEDED: ...", "(1) ...": the first is the one to report.
    """
    lines = [ln.strip() for ln in getattr(e, "message", str(e)).splitlines()]
    for ln in lines:
        root = _ROOT_ERROR.match(ln)
        if root:
            return root.group(1)
    lines = [ln for ln in lines if ln and not ln.startswith(("Graph execution", "Detected at", "File ", "Node:", "[["))]
    return lines[-1] if lines else str(e)


def make_model(cfg: BenchConfig):
    if cfg.input_only:
        return InputOnlyModel(cfg.image_size)
    from models import ResNet50Model

    return ResNet50Model(
        version=cfg.resnet_version,
        data_format=cfg.data_format,
        image_size=cfg.image_size,
        use_fp16=cfg.use_fp16,
        use_xla=cfg.use_xla_compile,
        # The linear scaling rule (0.1 per 256 images): tiny CPU batches would diverge at 0.1.
        learning_rate=0.1 * cfg.batch * cfg.num_gpus / 256,
    )


def make_trainer(cfg: BenchConfig):
    towers = list(range(cfg.num_gpus))
    if cfg.variable_update == "replicated":
        return SyncMultiGPUTrainerReplicated(towers, average=True, mode="gpu")
    if cfg.variable_update == "parameter_server":
        return SyncMultiGPUTrainerParameterServer(towers, ps_device=cfg.ps_device)
    raise ValueError(f"--variable-update {cfg.variable_update!r} is not supported here")


def _producers(cfg: BenchConfig, endpoint: str, path: str = "") -> ProducerGroup | None:
    if cfg.endpoint:
        print(f"  waiting for an external producer to connect to {endpoint}", flush=True)
        return None
    cmds = [
        producer_command(
            cfg.producer,
            endpoint,
            1000 * i,
            cfg.batch,
            cfg.image_size,
            cfg.wire_format,
            cfg.producer_workers,
            cfg.hwm,
            data=cfg.data,
            curve_keys=cfg.curve_keys,
            rate=cfg.producer_rate,
            # zmq-consume has no headers to carry producer telemetry: read the producers' progress lines
            quiet=not (cfg.telemetry and path == "zmq-consume"),
        )
        for i in range(cfg.producers)
    ]
    return ProducerGroup(cmds, endpoint).start()


def run_path(cfg: BenchConfig, path: str, has_gpu: bool, extra_callbacks: list[Callback] = ()) -> dict:
    """Train `path` for warm-up + steps x repeats and return its figures.

    `extra_callbacks` run inside the training session (tests use them to look at variables).
    """
    if cfg.max_msg_size is None:
        cfg.max_msg_size = expected_message_size(cfg.batch, cfg.image_size)
    tmp = tempfile.TemporaryDirectory(prefix="feedbench-")
    endpoint = cfg.endpoint or f"ipc://{tmp.name}/{path}"

    def cleanup() -> None:
        tmp.cleanup()
        if shm.is_shm(endpoint):  # the socket file of a bound shm:// endpoint (a signal skips the op's own clean-up)
            shm.remove_socket(endpoint)

    shutdown.register(cleanup)
    connection_stats: _ConnectionStats | None = None
    group: ProducerGroup | None = None
    flow: PullFlow | None = None
    graph = tf.Graph()
    try:
        with graph.as_default():
            if path == "gpu":
                source = on_device_input(cfg.batch, cfg.image_size)
            elif path == "cpu":
                source = stage_onto_devices(cpu_synthetic_input(cfg.batch, cfg.image_size))
            elif path in ("python-queue", "python-dataset"):
                flow = PullFlow(endpoint, cfg.hwm, cfg.recv_timeout, cfg.max_msg_size, cfg.allow_remote, cfg.curve_keys)
                flow.open()
                group = _producers(cfg, endpoint, path)
                if path == "python-queue":
                    source = stage_onto_devices(python_queue_input(flow))
                else:
                    source = stage_onto_devices(python_dataset_input(flow, cfg.batch, cfg.image_size))
            elif path == "zmq-consume":
                pulled = zmq_op_input(
                    endpoint, cfg.batch, cfg.image_size, cfg.hwm, cfg.recv_timeout, cfg.max_msg_size, cfg.curve_keys
                )
                connection_stats = _ConnectionStats(pulled.zmq_socket)
                source = stage_onto_devices(pulled)
                group = _producers(cfg, endpoint, path)
            elif path == "dali":
                from consumers.dali_tf import dali_dataset_input

                threads = max(1, cfg.producer_workers)
                source = stage_onto_devices(dali_dataset_input(cfg.data, cfg.batch, cfg.image_size, threads, has_gpu))
            else:
                raise ValueError(f"unknown input path {path!r}")

            model = make_model(cfg)

            def tower_cost(*inputs):
                cost = model.build_graph(*inputs)
                if get_current_tower_context().index == 0:
                    tf.compat.v1.add_to_collection(COST_COLLECTION, cost)
                return cost

            trainer = make_trainer(cfg)
            trainer.setup_graph(model.get_input_signature(), source, tower_cost, model.get_optimizer)
            if not has_gpu and not os.environ.get("FB_NOREMAP"):
                devices.map_towers_to_cpus(graph, cfg.num_gpus)
            timer = StepTimer()
            callbacks = [timer] if cfg.input_only else [RunUpdateOps(), timer]
            if group is not None:
                callbacks.append(_WatchProducers(group, cfg.on_producer_exit))
            telemetry = None
            if cfg.telemetry:
                telemetry = Telemetry(
                    source,
                    cfg.warmup_steps,
                    cfg.batch * cfg.num_gpus,
                    cfg.batch,
                    consumer=(lambda: flow.consumer) if flow is not None else None,
                    producers=group if path == "zmq-consume" else None,
                    sample_every=cfg.telemetry_every,
                    total_steps=cfg.warmup_steps + cfg.steps * cfg.repeats,
                    op_counters=connection_stats,
                )
            if cfg.profile_dir:
                callbacks.append(ProfileSteps(os.path.join(cfg.profile_dir, path), cfg.warmup_steps, 3, telemetry))
            if telemetry is not None:
                callbacks.append(telemetry)
            callbacks.append(RunProgress(path, cfg.warmup_steps, cfg.warmup_steps + cfg.steps * cfg.repeats, telemetry))
            if connection_stats is not None:
                callbacks.append(connection_stats)
            callbacks.extend(extra_callbacks)
            needed = cfg.warmup_steps + cfg.steps * cfg.repeats
            try:
                trainer.train(
                    callbacks=callbacks,
                    monitors=[],
                    session_creator=NewSessionCreator(config=devices.session_config(cfg.num_gpus, has_gpu)),
                    session_init=JustCurrentSession(),
                    steps_per_epoch=needed,
                    starting_epoch=1,
                    max_epoch=1,
                )
            except tf.errors.DeadlineExceededError as e:
                raise InputError(f"{path}: {op_message(e)}") from None
            except ProducerDied as e:
                raise InputError(f"{path}: {e}") from None
            if len(timer.ends) < needed:
                why = ""
                if flow is not None and flow.consumer is not None:
                    why = f": no batch from {endpoint} within {cfg.recv_timeout:g} s"
                if group is not None:
                    try:
                        group.check()
                    except ProducerDied as e:
                        why = f": {e}"
                raise InputError(f"{path}: input ended after {len(timer.ends)} of {needed} steps{why}")
            result = summarize(timer, cfg.warmup_steps, cfg.steps, cfg.repeats, cfg.batch * cfg.num_gpus, cfg.num_gpus)
            result["bytes_per_image"] = cfg.image_size * cfg.image_size * 3 + 4
            if flow is not None and flow.consumer is not None:
                # Per producer, from sequence numbers: what arrived, what went missing or came twice.
                result["producers"] = flow.consumer.tracker.table()
            if connection_stats is not None:
                # Every batch the op accepted: the steps' batches plus one staged per device, ahead.
                result["producers"] = connection_stats.producers
                result["batches_pulled"] = connection_stats.messages
            if telemetry is not None:
                result["telemetry"] = telemetry.summary()
                result["telemetry"]["trainer"] = {
                    "images_per_sec": result["images_per_sec"]["median"],
                    "images_per_sec_per_device": result["images_per_sec_per_device"]["median"],
                    "step_time_ms": result["step_time_ms"],
                }
            return result
    finally:
        if group is not None:
            group.stop()
        if flow is not None:
            flow.close()
        shutdown.unregister(cleanup)
        cleanup()
