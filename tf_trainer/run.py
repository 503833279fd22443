"""Run one input path end to end: build its graph, start its producers, train and measure, stop cleanly.

`build` makes the graph of a run (the path's input, the towers, the trainer)
without training it, so tests can look at device placement; `run_path`
builds, trains for warm-up + steps x repeats and returns the path's figures.
Every path-specific piece comes from the path's class (tf_trainer/inputs/).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass, replace
from typing import Any

from tensorpack.callbacks import Callback, RunUpdateOps
from tensorpack.tfutils.sesscreate import NewSessionCreator
from tensorpack.tfutils.sessinit import JustCurrentSession
from tensorpack.tfutils.tower import get_current_tower_context
from tensorpack.train import SyncMultiGPUTrainerParameterServer, SyncMultiGPUTrainerReplicated

from core import registry
from core.config import BenchConfig
from core.errors import ConfigError, InputError
from profiler.progress import RunProgress
from runner import shutdown
from runner.producer_group import ProducerDied, ProducerGroup, start_producers
from tf_trainer import devices
from tf_trainer.inputs.base import TFInputPath
from tf_trainer.measure import COST_COLLECTION, Progress, StepTimer, summarize
from tf_trainer.models.input_only import InputOnlyModel
from tf_trainer.telemetry import Telemetry
from tf_trainer.tf_env import tf
from tf_trainer.tracing import ProfileSteps

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
    from tf_trainer.models import ResNet50Model

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
    raise ConfigError(f"--variable-update {cfg.variable_update!r} is not supported here")


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
        cfg.max_msg_size = expected_message_size(cfg.batch, cfg.image_size)
    path = registry.get("tf", path_name)(cfg, endpoint)
    graph = tf.Graph()
    with graph.as_default():
        model = make_model(cfg)
        specs = batch_signature(model, cfg.batch)
        source = path.build(specs, has_gpu)

        def tower_cost(*inputs):
            cost = model.build_graph(*inputs)
            if get_current_tower_context().index == 0:
                tf.compat.v1.add_to_collection(COST_COLLECTION, cost)
            return cost

        trainer = make_trainer(cfg)
        trainer.setup_graph(specs, source, tower_cost, model.get_optimizer)
        if not has_gpu:
            devices.map_towers_to_cpus(graph, cfg.num_gpus)
    return Built(graph, trainer, source, path, model, cfg)


def _callbacks(built: Built, group: ProducerGroup | None, extra: list[Callback]) -> tuple[StepTimer, list[Callback]]:
    """The training session's callbacks: timing, the path's own, producer watch, telemetry, profile, progress."""
    cfg, path = built.cfg, built.path
    total = cfg.warmup_steps + cfg.steps * cfg.repeats
    timer = StepTimer()
    callbacks = [timer] if cfg.input_only else [RunUpdateOps(), timer]
    if group is not None:
        callbacks.append(_WatchProducers(group, cfg.on_producer_exit))
    telemetry = None
    if cfg.telemetry:
        telemetry = Telemetry(
            path, cfg.warmup_steps, cfg.batch * cfg.num_gpus, sample_every=cfg.telemetry_every, total_steps=total
        )
    if cfg.profile_dir:
        callbacks.append(ProfileSteps(os.path.join(cfg.profile_dir, path.name), cfg.warmup_steps, 3, telemetry))
    if telemetry is not None:
        callbacks.append(telemetry)
    status = telemetry.live if telemetry is not None else None
    callbacks.append(Progress(RunProgress(path.name, cfg.warmup_steps, total, status)))
    callbacks += path.callbacks()
    callbacks += extra
    return timer, callbacks


def _train(built: Built, callbacks: list[Callback], has_gpu: bool) -> None:
    """Train for warm-up + steps x repeats; an input that fails is raised as one InputError line."""
    cfg, path = built.cfg, built.path
    where = f"{path.name}: {path.endpoint}" if path.needs_producers else path.name
    try:
        built.trainer.train(
            callbacks=callbacks,
            monitors=[],
            session_creator=NewSessionCreator(config=devices.session_config(cfg.num_gpus, has_gpu)),
            session_init=JustCurrentSession(),
            steps_per_epoch=cfg.warmup_steps + cfg.steps * cfg.repeats,
            starting_epoch=1,
            max_epoch=1,
        )
    except ProducerDied as e:
        raise InputError(f"{where}: {e}") from None
    except tf.errors.OpError as e:
        # The path's own words first (a Python consumer's wire error), else the op's.
        raise InputError(f"{where}: {path.failure() or op_message(e)}") from None


def _check_complete(built: Built, timer: StepTimer, group: ProducerGroup | None) -> None:
    """An input that ended early (its stream closed) is an InputError naming why, if known."""
    cfg, path = built.cfg, built.path
    needed = cfg.warmup_steps + cfg.steps * cfg.repeats
    if len(timer.ends) >= needed:
        return
    where = f"{path.name}: {path.endpoint}" if path.needs_producers else path.name
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
    tmp = tempfile.TemporaryDirectory(prefix="feedbench-")
    shutdown.register(tmp.cleanup)
    group: ProducerGroup | None = None
    built: Built | None = None
    try:
        built = build(cfg, path, cfg.num_gpus, has_gpu, cfg.endpoint or f"ipc://{tmp.name}/{path}")
        cfg = built.cfg
        with built.graph.as_default():
            built.path.open()
            if built.path.needs_producers:
                if cfg.endpoint:
                    print(f"  waiting for an external producer to connect to {cfg.endpoint}", flush=True)
                else:
                    group = built.path.producers = start_producers(cfg, built.path.endpoint, tmp.name)
            timer, callbacks = _callbacks(built, group, list(extra_callbacks))
            _train(built, callbacks, has_gpu)
            _check_complete(built, timer, group)
            return _result(built, timer, callbacks)
    finally:
        if group is not None:
            group.stop()
        if built is not None:
            built.path.close()
        shutdown.unregister(tmp.cleanup)
        tmp.cleanup()


def _result(built: Built, timer: StepTimer, callbacks: list[Callback]) -> dict:
    """The path's result dict (docs/results.md): timing figures, accounting, each stage's telemetry."""
    cfg = built.cfg
    result = summarize(timer, cfg.warmup_steps, cfg.steps, cfg.repeats, cfg.batch * cfg.num_gpus, cfg.num_gpus)
    result["bytes_per_image"] = cfg.image_size * cfg.image_size * 3 + 4
    result["input"] = {"name": built.path.name, **built.path.describe()}
    result.update(built.path.result_fields())
    telemetry = next((c for c in callbacks if isinstance(c, Telemetry)), None)
    if telemetry is not None:
        result["telemetry"] = telemetry.summary()
        result["telemetry"]["trainer"] = {
            "images_per_sec": result["images_per_sec"]["median"],
            "images_per_sec_per_device": result["images_per_sec_per_device"]["median"],
            "step_time_ms": result["step_time_ms"],
        }
    return result
