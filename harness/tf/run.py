"""Run one input path end to end: build its graph, start its producers, train and measure, stop cleanly.

`build` makes the graph of a run (the path's input, the towers, the trainer)
without training it, so tests can look at device placement; `run_path`
builds, trains for warm-up + steps x repeats and returns the path's figures.
Every path-specific piece comes from the path's class (consumers/<path>/tf.py).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

from tensorpack.callbacks import Callback, RunUpdateOps
from tensorpack.tfutils.sesscreate import NewSessionCreator
from tensorpack.tfutils.sessinit import JustCurrentSession
from tensorpack.tfutils.tower import get_current_tower_context

from consumers import declared
from consumers.expect import receive_cap
from consumers.tf_expected import batch_error
from consumers.tf_half import TFInputPath
from core.config import BenchConfig
from core.errors import ConfigError, InputError
from core.result_fields import refuse_undeclared
from frameworks.tf_env import import_tf
from harness.schedule import PROFILED_STEPS, Schedule
from harness.tf import devices, placement
from harness.tf.measure import COST_COLLECTION, Progress, StepTimer, summarize
from harness.tf.telemetry import CpuUse, Telemetry
from harness.tf.tracing import ProfileSteps
from models.tf.input_only import InputOnlyModel
from profiler import first_batch
from profiler.progress import RunProgress
from profiler.telemetry import add_common_fields
from profiler.training import base_learning_rate
from runner import shutdown
from runner.producer_group import ProducerDied, ProducerGroup, ProducerWatch, RunDir
from wire.endpoints import EndpointError, release

tf = import_tf()


class _Quiet(logging.Filter):
    """Drop tensorpack lines that mislead here: its failure record (malformed, it prints a logging
    traceback; the run reports the error itself) and, only where towers on the CPU are intended (no
    GPU), its GPU and placement warnings. With GPUs every placement message gets through."""

    NOISE = (
        "Training failed at global_step",
        "non-trainable",  # batch-norm statistics live on the first tower only, as in tensorpack's BatchNorm
    )
    CPU_ONLY_NOISE = (
        "not built with CUDA",
        "GPU",
        "gpu_device",
        "To workaround",
        "Avoid initializing",
        "Typically",
        "Manually set",
    )

    def __init__(self) -> None:
        super().__init__()
        self.has_gpu = False  # set by run_path for each run

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        noise = self.NOISE if self.has_gpu else self.NOISE + self.CPU_ONLY_NOISE
        return not any(n in msg for n in noise)


_log = logging.getLogger("tensorpack")
_log.setLevel(logging.WARNING)
QUIET = _Quiet()
_log.addFilter(QUIET)


def warn_soft_placement(graph) -> list[str]:
    """Say which ops soft placement will move off their GPU (no GPU kernel for their types); returns them.

    The session allows soft placement, so such an op would otherwise run on
    the host without a word, its inputs copied across every step. The answer
    comes from TensorFlow's kernel registry (harness/tf/kernels.py); where it
    cannot answer (tensorflow-cpu) there is no GPU to move anything off.
    """
    from harness.tf import kernels

    if not kernels.registry_has_gpu_kernels():
        return []
    moved = kernels.missing_gpu_kernels(graph)
    if moved:
        print(
            f"  warning: soft placement moves {len(moved)} op(s) from their GPU to the host (no GPU kernel): "
            + "; ".join(moved),
            flush=True,
        )
    return moved


class _WatchProducers(Callback):
    """Stops training at once when the producer group fails, instead of waiting for a receive timeout.

    The group's watcher thread closes the session, which cancels a step
    blocked on input; the run then reports the producer's own line. Between
    steps, --on-producer-exit is applied as a PyTorch rank applies it
    (runner/producer_group.py `ProducerWatch`).
    """

    def __init__(self, group: ProducerGroup, on_exit: str) -> None:
        self.group = group
        self.watch = ProducerWatch(group, on_exit)

    def _cancel(self) -> None:
        self.trainer.sess.close()

    def _before_train(self) -> None:
        self.group.on_failure(self._cancel)
        self.group.check()  # it may have failed while the session was made

    def _after_train(self) -> None:
        self.group.remove_on_failure(self._cancel)

    def _trigger_step(self) -> None:
        self.watch.check()


_ROOT_ERROR = re.compile(r"^\(\d+\) [A-Z_]+: *(.+)$")


def op_text(e: Exception, endpoint: str | None) -> str:
    """What the op said was wrong, without its own mention of the endpoint (the run's line names it)."""
    text = op_message(e)
    if endpoint:
        for said in (f" from ZMQ endpoint {endpoint}", f" from {endpoint}", f"ZMQ endpoint {endpoint}: "):
            text = text.replace(said, "")
    return text


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
    if cfg.model == "emulated":
        from models.tf.emulated import EmulatedModel

        return EmulatedModel(cfg.image_size, cfg.emulation["images_per_sec"])
    from models.tf import ResNet50Model

    return ResNet50Model(
        version=cfg.resnet_version,
        data_format=cfg.data_format,
        image_size=cfg.image_size,
        use_fp16=cfg.use_fp16,
        use_xla=cfg.use_xla_compile,
        # The linear scaling rule (0.1 per 256 images) unless --learning-rate, warmed up over the warm-up steps.
        learning_rate=base_learning_rate(cfg.learning_rate, cfg.batch * cfg.num_gpus),
        warmup_steps=cfg.warmup_steps,
    )


def make_trainer(cfg: BenchConfig, has_gpu: bool):
    """tensorpack's trainer for --variable-update, placed as on `has_gpu` machines (harness/tf/placement.py)."""
    if cfg.variable_update.startswith("distributed_"):
        from harness.tf import cluster  # this process's server, started by harness.tf.cluster_worker

        return cluster.make_trainer(cfg.variable_update, cfg.num_gpus)
    try:
        return placement.make_trainer(cfg.variable_update, cfg.num_gpus, cfg.ps_device, has_gpu)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def batch_signature(model, batch: int) -> list:
    """The model's input signature with the per-device batch filled in: what every path must deliver."""
    return [tf.TensorSpec((batch, *s.shape[1:]), s.dtype, s.name) for s in model.get_input_signature()]


@dataclass
class Built:
    """A run's graph, ready to train: what `build` returns."""

    graph: Any
    trainer: Any
    source: Any  # the tensorpack InputSource the towers read
    path: TFInputPath
    model: Any
    cfg: BenchConfig


def build(
    cfg: BenchConfig, path_name: str, num_gpus: int | None = None, has_gpu: bool = False, endpoint: str | None = None
) -> Built:
    """Build the graph of `path_name` on `num_gpus` towers (default cfg.num_gpus) without training it.

    Opens no socket and starts no producer (the path's `open` and the run do);
    `endpoint` only names what a producer path would bind when run. Without a
    GPU (`has_gpu` False) the towers are moved onto one virtual CPU device each.
    """
    endpoint = endpoint or cfg.endpoint or f"ipc://{tempfile.gettempdir()}/feedbench-{path_name}"
    if num_gpus is not None and num_gpus != cfg.num_gpus:
        cfg = replace(cfg, num_gpus=num_gpus)
    if cfg.max_msg_size is None:
        cfg.max_msg_size = receive_cap(cfg.batch, cfg.image_size)
    path = declared.get("tf", path_name)(cfg, endpoint)
    graph = tf.Graph()
    with graph.as_default():
        model = make_model(cfg)
        specs = batch_signature(model, cfg.batch)
        source = path.build(specs, has_gpu)

        def tower_cost(*inputs):
            tf.compat.v1.add_to_collection(placement.TOWER_INPUTS, list(inputs))  # each tower's batch, in order
            cost = model.build_graph(*inputs)
            if get_current_tower_context().index == 0:
                tf.compat.v1.add_to_collection(COST_COLLECTION, cost)
            return cost

        trainer = make_trainer(cfg, has_gpu)
        trainer.setup_graph(specs, source, tower_cost, model.get_optimizer)
        if not has_gpu:
            devices.map_towers_to_cpus(graph, cfg.num_gpus)
    return Built(graph, trainer, source, path, model, cfg)


def _callbacks(built: Built, group: ProducerGroup | None, extra: list[Callback]) -> tuple[StepTimer, list[Callback]]:
    """The training session's callbacks: timing, producer watch, profile, progress, the path's own.

    Telemetry and CPU use are no callbacks of their own: the step timer runs them in the untimed steps
    they name, so with telemetry on a timed step runs the same hooks as with it off.
    """
    cfg, path = built.cfg, built.path
    schedule = Schedule.of(cfg)
    telemetry = None
    samplers: list[Callback] = []
    if cfg.telemetry:
        telemetry = Telemetry(path, schedule, cfg.batch * cfg.num_gpus, sample_every=cfg.telemetry_every)
        samplers = [telemetry, CpuUse(cfg.warmup_steps, schedule.total, group)]  # CPU per input stage
    timer = StepTimer(samplers)
    callbacks = [timer] if cfg.input_only else [RunUpdateOps(), timer]
    if group is not None:
        callbacks.append(_WatchProducers(group, cfg.on_producer_exit))
    if cfg.profile_dir:
        callbacks.append(
            ProfileSteps(os.path.join(cfg.profile_dir, path.name), schedule.profile_start, PROFILED_STEPS, telemetry)
        )
    status = telemetry.live if telemetry is not None else None
    callbacks.append(Progress(RunProgress(path.name, cfg.warmup_steps, schedule.total, status)))
    callbacks += path.callbacks()
    callbacks += extra
    return timer, callbacks


def _train(built: Built, callbacks: list[Callback], has_gpu: bool, group: ProducerGroup | None) -> None:
    """Train for warm-up + steps x repeats; an input that fails is raised as one InputError line.

    A producer that died is the cause whatever the step then says (cancelled,
    a closed session, an ended stream), so it is asked first.
    """
    cfg, path = built.cfg, built.path
    where = f"{path.name}: {path.endpoint}" if path.declaration.needs_producers else path.name
    try:
        built.trainer.train(
            callbacks=callbacks,
            monitors=[],
            session_creator=NewSessionCreator(config=devices.session_config(cfg.num_gpus, has_gpu)),
            session_init=JustCurrentSession(),
            steps_per_epoch=Schedule.of(cfg).total,
            starting_epoch=1,
            max_epoch=1,
        )
    except ProducerDied as e:
        raise InputError(f"{where}: {e}") from None
    except (tf.errors.OpError, RuntimeError) as e:
        if group is not None:
            try:
                group.check()
            except ProducerDied as died:
                raise InputError(f"{where}: {died}") from None
        if not isinstance(e, tf.errors.OpError):
            raise
        # The path's own words first (a Python consumer's wire error), else the op's.
        why = path.failure() or batch_error(e, batch_signature(built.model, cfg.batch)) or op_text(e, path.endpoint)
        raise InputError(f"{where}: {why}") from None


def _check_complete(built: Built, timer: StepTimer, group: ProducerGroup | None) -> None:
    """An input that ended early (its stream closed) is an InputError naming why, if known."""
    cfg, path = built.cfg, built.path
    needed = Schedule.of(cfg).total
    if len(timer.ends) >= needed:
        return
    where = f"{path.name}: {path.endpoint}" if path.declaration.needs_producers else path.name
    why = path.failure() or ""
    if group is not None:
        try:
            group.check()
        except ProducerDied as e:
            why = str(e)
    raise InputError(f"{where}: input ended after {len(timer.ends)} of {needed} steps{': ' + why if why else ''}")


def run_path(cfg: BenchConfig, path: str, has_gpu: bool, extra_callbacks: list[Callback] = ()) -> dict:
    """Train `path` for warm-up + steps x repeats and return its figures.

    `extra_callbacks` run inside the training session (tests use them to look at variables).
    """
    # The run's own folder (sockets, producer stats) is made only for a path with producers, right
    # before they start, and under /tmp if TMPDIR is too long for a socket path.
    own = declared.get("tf", path).declaration.needs_producers and not cfg.endpoint
    run_dir = RunDir(longest=path, transport=cfg.transport) if own else None
    group: ProducerGroup | None = None
    built: Built | None = None
    release_endpoint = None
    QUIET.has_gpu = has_gpu
    try:
        built = build(cfg, path, cfg.num_gpus, has_gpu, cfg.endpoint or (run_dir.endpoint(path) if run_dir else None))
        cfg = built.cfg
        if has_gpu:
            warn_soft_placement(built.graph)
        if cfg.endpoint and built.path.declaration.needs_producers:
            # The op binds it, and ZMQ leaves the socket file behind (for shm://, the slot messages'
            # socket); a signal skips `finally` and the op's own clean-up, so it is a shutdown clean-up too.
            release_endpoint = functools.partial(release, cfg.endpoint, True)
            shutdown.register(release_endpoint)
        with built.graph.as_default():
            if run_dir is not None:
                run_dir.make()
            opened = time.perf_counter()  # the path's start, for its time to the first batch
            try:
                built.path.open()
            except EndpointError as e:  # taken since the run's check (another process bound it meanwhile)
                raise InputError(f"{path}: {e}") from None
            group = built.path.start(run_dir and run_dir.name)  # what the path feeds from, its own to start
            timer, callbacks = _callbacks(built, group, list(extra_callbacks))
            _train(built, callbacks, has_gpu, group)
            _check_complete(built, timer, group)
            return _result(built, timer, opened)
    finally:
        if built is not None:
            built.path.stop()
            built.path.close()
        if run_dir is not None:
            run_dir.remove()
        elif release_endpoint is not None:
            shutdown.unregister(release_endpoint)
            release_endpoint()


def _result(built: Built, timer: StepTimer, opened: float) -> dict:
    """The path's result dict (docs/results.md): timing figures, accounting, each stage's telemetry."""
    cfg = built.cfg
    scale = getattr(built.model, "loss_scale", None) if getattr(built.model, "use_fp16", False) else None
    result = summarize(timer, Schedule.of(cfg), cfg.batch * cfg.num_gpus, cfg.num_gpus, scale)
    parts = {"to_first_step_s": timer.starts[0] - opened, "first_step_s": timer.ends[0] - timer.starts[0]}
    result["first_batch"] = first_batch.figure("tf", timer.ends[0] - opened, parts=parts)
    telemetry = next((c for c in timer.samplers if isinstance(c, Telemetry)), None)
    if telemetry is not None:
        result["telemetry"] = telemetry.summary()
        cpu_use = next((c for c in timer.samplers if isinstance(c, CpuUse)), None)
        result["telemetry"]["cpu"] = cpu_use.summary() if cpu_use is not None else None
    fields = built.path.result_fields()  # after the telemetry: a path may read its window's figures
    refuse_undeclared(built.path.declaration.result_fields(), fields, built.path.name)
    result.update(fields)
    add_common_fields(result, cfg, built.path.describe())
    return result
