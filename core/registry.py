"""Input paths by name: one class per way of feeding the trainer, per framework.

Modelled on tensorpack's `input_source/`: a small base class says what every
path must provide, and each path is one subclass in one file, registered by
name with `@register`. What a path is (its name, summary, order, advice and
shared flag checks) is declared once, in `consumers/<path>/path.py`, and both
frameworks' classes take it from there (`declaration`). The TensorFlow
half sits beside it in `consumers/<path>/tf.py`, the PyTorch half in
`consumers/<path>/torch.py`; `consumers.declared.import_halves` imports
every half of a framework (a class registered from anywhere, as the tests
do, works too).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from core.errors import ConfigError

FRAMEWORKS = ("tf", "torch")
# Where `import_halves(framework)` lives: importing a framework's halves registers its input paths.
HALVES = "consumers.declared"
BASELINE = "gpu"

_registry: dict[str, dict[str, type[InputPath]]] = {fw: {} for fw in FRAMEWORKS}


# A path's words: one string for both frameworks, or one per framework where their halves work differently.
Words = str | dict[str, str]
IDENTITY = (
    "name",
    "summary",
    "order",
    "in_default_run",
    "needs_producers",
    "advice",
    "input_advice",
    "delivers_words",
    "host_cpu_advice",
)


@dataclass(frozen=True)
class Declaration:
    """One input path as both frameworks know it, declared once in `consumers/<path>/path.py`.

    Each framework's half (`consumers/<path>/tf.py`, `consumers/<path>/torch.py`) names it
    as its `declaration` and takes every field from it, so the CLI's choices and
    help, the report and the verdict's advice read one place. `validate` holds
    the flag checks both halves share; `checks` what one framework's half needs
    beyond them (its plugin installed, its native code built). Both run before
    the framework is imported: a PyTorch run's own process never imports torch.
    """

    name: str
    summary: Words
    order: int
    advice: Words = "speed up the consumer"
    in_default_run: bool = True
    needs_producers: bool = False
    input_advice: Words | None = None
    delivers_words: Words | None = None
    host_cpu_advice: Words | None = None
    validate: Callable[[Any], None] | None = None
    checks: Mapping[str, Callable[[Any], None]] = field(default_factory=dict)  # framework -> its own check
    frameworks: tuple[str, ...] = ("tf", "torch")  # the trainers with a half of this path

    def check(self, cfg: Any, framework: str) -> None:
        """The shared checks, then `framework`'s own (raise ConfigError)."""
        if self.validate is not None:
            self.validate(cfg)
        own = self.checks.get(framework)
        if own is not None:
            own(cfg)

    def words(self, field: str, framework: str) -> Any:
        """The field's value for `framework` (None: the InputPath default stands)."""
        value = getattr(self, field)
        return value.get(framework) if isinstance(value, dict) else value


class InputPath:
    """What every input path provides, whatever the framework.

    A framework's half names its path's `declaration`, which sets the class
    attributes below (a class made elsewhere, e.g. in a test, may set them
    itself), and overrides what it needs. A path object is made per run
    (`cls(cfg)`), so it may keep the run's state (its sockets, producers,
    counters) and report it through the stage contract below.
    """

    declaration: ClassVar[Declaration | None] = None

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A half that names its declaration takes its identity from it, for its own framework."""
        super().__init_subclass__(**kwargs)
        d = cls.__dict__.get("declaration")
        if d is None:
            return
        for name in IDENTITY:
            value = d.words(name, cls.framework)
            if value is not None:
                setattr(cls, name, value)

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @classmethod
    def validate(cls, cfg: Any) -> None:
        """Refuse flags this path cannot work with, before anything starts (raise ConfigError).

        The declaration's checks: those both halves share, then this framework's own.
        """
        if cls.declaration is not None:
            cls.declaration.check(cfg, cls.framework)

    # --- the stage contract: raw state only; profiler.telemetry.stage_figures computes every figure ----------
    def counters(self, session: Any = None) -> dict | None:
        """The wire's counters now ({time, messages, bytes, latency_s, wait_s, received}), or None.

        Both trainers take them at the measured window's edges (TensorFlow passes its session, whose
        ops hold the native consumer's counters).
        """
        return None

    def sampled_stages(self) -> list:
        """Stages sampled during the measured steps (objects with `name` and `figures()`): queues, staging."""
        return []

    def producer_figures(self, window: tuple[dict, dict] | None) -> dict | None:
        """What the producers did over `window` (the `counters()` at its edges); None if unknown."""
        return None

    def result_fields(self) -> dict:
        """Fields this path adds to its result: per-producer accounting, batches pulled."""
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
            # Who makes the batches (docs/results.schema.json); "feeder" is what puts a batch on a device (feeders/).
            "batch_maker": batch_maker_of(self.cfg) if self.needs_producers else None,
        }


def batch_maker_of(cfg: Any) -> dict | None:
    """Who makes the batches a producer-fed path receives, for the report and the verdict's advice."""
    if cfg is None:
        return None
    workers = getattr(cfg, "producers", 1) * getattr(cfg, "producer_workers", 1)
    if getattr(cfg, "endpoint", None):
        return {"kind": "external", "name": f"the external producer at {cfg.endpoint}", "endpoint": cfg.endpoint}
    if getattr(cfg, "loader", None) and getattr(cfg, "producer_kind", "loader") == "loader":
        return {"kind": "loader", "name": f"loader {cfg.loader}", "loader": cfg.loader, "workers": workers}
    kind = getattr(cfg, "producer_kind", "synthetic")
    name = f"{kind} producers"
    if kind in ("decode", "dali") and getattr(cfg, "data", None):  # say that real JPEGs were decoded, and where from
        name += f" decoding the JPEGs in {cfg.data}"
    if kind == "read" and getattr(cfg, "data", None):
        name += f" sending the JPEG files of {cfg.data} undecoded"
    return {"kind": kind, "name": name, "workers": workers}


def needs_data(cfg: Any, path: str) -> None:
    """Refuse a path that decodes a JPEG folder when --data names none."""
    if not cfg.data or not os.path.isdir(cfg.data):
        raise ConfigError(
            f"--fake-location {path} needs --data DIR, a JPEG folder (make one: python -m producers make-dataset DIR)"
        )


def register(cls: type[InputPath]) -> type[InputPath]:
    """Class decorator: make `cls` available by its name for its framework."""
    if not cls.name or cls.framework not in _registry:
        raise TypeError(f"{cls.__name__}: an input path needs a name and a framework in {sorted(_registry)}")
    _registry[cls.framework][cls.name] = cls
    return cls


def load(framework: str) -> dict[str, type[InputPath]]:
    """Every registered path of `framework`, importing its halves first."""
    if framework not in _registry:
        raise ConfigError(f"--framework {framework!r}: choose from {', '.join(sorted(_registry))}")
    importlib.import_module(HALVES).import_halves(framework)
    return dict(sorted(_registry[framework].items(), key=lambda kv: (kv[1].order, kv[0])))


def registered(framework: str) -> dict[str, type[InputPath]]:
    """The paths of `framework` registered so far, importing nothing (a class registered by the caller counts)."""
    if framework not in _registry:
        raise ConfigError(f"--framework {framework!r}: choose from {', '.join(sorted(_registry))}")
    return dict(_registry[framework])


def get(framework: str, name: str) -> type[InputPath]:
    paths = load(framework)
    if name not in paths:
        raise ConfigError(
            f"--fake-location {name!r}: no such input path for {framework} (choose from {', '.join(paths)})"
        )
    return paths[name]


def names(framework: str) -> list[str]:
    """Every path of `framework`, in table order, from the declarations (the framework is not imported)."""
    return list(importlib.import_module(HALVES).declared(framework))


def default_run(framework: str) -> list[str]:
    """The paths a run compares when no --fake-location picks one (`in_default_run`), in table order."""
    return [n for n, d in importlib.import_module(HALVES).declared(framework).items() if d.in_default_run]


def batch_maker_line(cfg: Any, framework: str) -> str | None:
    """The run's line saying who feeds its producer-fed paths (None when no chosen path takes producers)."""
    known = importlib.import_module(HALVES).declared(framework)
    if not any(known[n].needs_producers for n in cfg.paths if n in known):
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
