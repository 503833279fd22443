"""Input paths by name: one class per way of feeding the trainer, per framework.

Modelled on tensorpack's `input_source/`: a small base class says what every
path must provide, and each path is one subclass in one file, registered by
name with `@register`. The TensorFlow paths live in `tf_trainer/inputs/`, the
PyTorch ones in `torch_trainer/inputs/`; each of those packages imports every
module in its folder, so adding a path means adding one file there (or
registering a class from anywhere, as the tests do) and nothing else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from core.errors import ConfigError

# Where each framework's input paths live; loading the package registers them.
FRAMEWORK_PACKAGES = {"tf": "tf_trainer.inputs", "torch": "torch_trainer.inputs"}
BASELINE = "gpu"

_registry: dict[str, dict[str, type[InputPath]]] = {fw: {} for fw in FRAMEWORK_PACKAGES}


class InputPath:
    """What every input path provides, whatever the framework.

    Subclasses set the class attributes and override what they need. A path
    object is made per run (`cls(cfg)`), so it may keep the run's state (its
    sockets, producers, counters) and report it from `stage_figures`.
    """

    name: ClassVar[str] = ""
    framework: ClassVar[str] = ""  # "tf" or "torch"
    summary: ClassVar[str] = ""  # one line for --help, the README table and docs
    order: ClassVar[int] = 100  # position in tables; the baseline comes first
    in_default_run: ClassVar[bool] = True  # part of the comparison run when no --fake-location is given
    needs_producers: ClassVar[bool] = False  # the run starts (or waits for) producers on an endpoint
    # What to try when this path's consumer side limits the run (the verdict quotes it).
    advice: ClassVar[str] = "speed up the consumer"
    # When the input limits and no producer figures say which side: what to try, and how to say what it delivered.
    input_advice: ClassVar[str] = "add producers (--producers) or use zmq-consume"
    delivers_words: ClassVar[str] = "the input delivers"
    # When steps run slower than the baseline without waiting: the input's host work competes with them.
    host_cpu_advice: ClassVar[str] = "move input work off the trainer's cores (zmq-consume, producers on other hosts)"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @classmethod
    def validate(cls, cfg: Any) -> None:
        """Refuse flags this path cannot work with, before anything starts (raise ConfigError)."""

    def measure_start(self) -> None:
        """The first timed step is next: snapshot the counters the stage figures are measured from."""

    def measure_end(self) -> None:
        """The last timed step is done: snapshot the counters again."""

    def stage_figures(self) -> dict[str, dict]:
        """This path's own figures by stage name ("queue", "wire", ...), from what it counted in between.

        profiler/telemetry.py turns raw counts into these figures, for every framework alike.
        """
        return {}

    def describe(self) -> dict[str, Any]:
        """What the report says about the path itself (kind, advice), next to its figures."""
        return {
            "name": self.name,
            "summary": self.summary,
            "advice": self.advice,
            "input_advice": self.input_advice,
            "delivers_words": self.delivers_words,
            "host_cpu_advice": self.host_cpu_advice,
            "needs_producers": self.needs_producers,
            # The schema's word for who makes the batches (docs/results.schema.json); feeders/ is the stage
            # that puts a batch on a device. Renaming the key takes a schema version of its own.
            "feeder": batch_maker_of(self.cfg) if self.needs_producers else None,
        }


def batch_maker_of(cfg: Any) -> dict | None:
    """Who makes the batches a producer-fed path receives, for the report and the verdict's advice."""
    if cfg is None:
        return None
    workers = getattr(cfg, "producers", 1) * getattr(cfg, "producer_workers", 1)
    if getattr(cfg, "endpoint", None):
        return {"kind": "external", "name": f"the external producer at {cfg.endpoint}", "endpoint": cfg.endpoint}
    if getattr(cfg, "loader", None):
        return {"kind": "loader", "name": f"loader {cfg.loader}", "loader": cfg.loader, "workers": workers}
    kind = getattr(cfg, "producer_kind", "synthetic")
    name = f"{kind} producers"
    if kind in ("decode", "dali") and getattr(cfg, "data", None):  # say that real JPEGs were decoded, and where from
        name += f" decoding the JPEGs in {cfg.data}"
    return {"kind": kind, "name": name, "workers": workers}


def register(cls: type[InputPath]) -> type[InputPath]:
    """Class decorator: make `cls` available by its name for its framework."""
    if not cls.name or cls.framework not in _registry:
        raise TypeError(f"{cls.__name__}: an input path needs a name and a framework in {sorted(_registry)}")
    _registry[cls.framework][cls.name] = cls
    return cls


def load(framework: str) -> dict[str, type[InputPath]]:
    """Every registered path of `framework`, importing its package of paths first."""
    if framework not in _registry:
        raise ConfigError(f"--framework {framework!r}: choose from {', '.join(sorted(_registry))}")
    importlib.import_module(FRAMEWORK_PACKAGES[framework])
    return dict(sorted(_registry[framework].items(), key=lambda kv: (kv[1].order, kv[0])))


def get(framework: str, name: str) -> type[InputPath]:
    paths = load(framework)
    if name not in paths:
        raise ConfigError(
            f"--fake-location {name!r}: no such input path for {framework} (choose from {', '.join(paths)})"
        )
    return paths[name]


def names(framework: str) -> list[str]:
    """Every path of `framework`, in table order."""
    return list(load(framework))


def default_run(framework: str) -> list[str]:
    """The paths a run compares when no --fake-location picks one (`in_default_run`), in table order."""
    return [n for n, c in load(framework).items() if c.in_default_run]


def batch_maker_line(cfg: Any, framework: str) -> str | None:
    """The run's line saying who feeds its producer-fed paths (None when no chosen path takes producers)."""
    paths = load(framework)
    if not any(paths[n].needs_producers for n in cfg.paths if n in paths):
        return None
    f = batch_maker_of(cfg)
    if f["kind"] == "external":
        return f"producers: {f['name']}"
    return f"producers: {f['name']}, {cfg.producers} process(es) x {cfg.producer_workers} worker(s)"


@dataclass(frozen=True)
class Limit:
    """A flag one framework's trainer cannot honour; the CLI refuses it for that framework from here only."""

    framework: str
    applies: Callable[[Any], bool]  # on the parsed flags (argparse.Namespace)
    line: str  # the error, naming the flag, why, and what to use instead


_DISTRIBUTED = "--local-cluster and distributed_* updates are TensorFlow's; PyTorch uses --nnodes (torchrun)"
LIMITS = (
    Limit(
        "torch",
        lambda a: a.variable_update == "parameter_server",
        "--variable-update parameter_server: PyTorch's DistributedDataParallel all-reduces gradients "
        "(replicated); there is no parameter server with --framework torch",
    ),
    Limit("torch", lambda a: a.ps_device != "cpu", "--ps-device: there is no parameter server with --framework torch"),
    Limit("torch", lambda a: bool(a.local_cluster), _DISTRIBUTED),
    Limit("torch", lambda a: a.variable_update.startswith("distributed_"), _DISTRIBUTED),
    Limit(
        "torch",
        lambda a: a.nnodes > 1 and (a.find_capacity or a.bench),
        "--find-capacity with --nnodes > 1: a capacity search probes one machine; drop --nnodes",
    ),
    Limit("tf", lambda a: a.nnodes > 1, "--nnodes: several machines need --framework torch (torchrun)"),
)


def refuse_limits(framework: str, args: Any) -> None:
    """Raise ConfigError for the first flag in `args` that `framework`'s trainer cannot honour."""
    for limit in LIMITS:
        if limit.framework == framework and limit.applies(args):
            raise ConfigError(limit.line)
