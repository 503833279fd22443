"""What an input path is and provides, whatever the framework: its declaration, its base class, its registration.

Modelled on tensorpack's `input_source/`: a small base class says what every
path must provide. A path is one folder, `consumers/<path>/`: its
declaration (`path.py`: name, summary, order, advice, shared flag checks, the
result fields it adds) and a half per framework beside it (`tf.py`,
`torch.py`), each one subclass registered by name with `@register` and naming
the declaration as its `declaration`, the path's one identity object.
Finding the folders and importing their halves is `consumers.declared`'s job;
this module imports no path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from core.errors import ConfigError
from core.result_fields import ResultField

FRAMEWORKS = ("tf", "torch")
BASELINE = "gpu"

_registry: dict[str, dict[str, type[InputPath]]] = {fw: {} for fw in FRAMEWORKS}


# A path's words: one string for both frameworks, or one per framework where their halves work differently.
Words = str | dict[str, str]
# What a path is: its declaration's fields, read from there only (a half's class attribute of one of these
# names would say something its declaration does not).
IDENTITY = (
    "name",
    "summary",
    "order",
    "in_default_run",
    "needs_producers",
    "advice",
    "input_advice",
    "floor_words",
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
    summary: Words  # one line for --help, the README table and docs
    order: int  # position in tables; the baseline comes first
    # What to try when this path's consumer side limits the run (the verdict quotes it).
    advice: Words = "speed up the consumer"
    in_default_run: bool = True  # part of the comparison run when no --fake-location is given
    needs_producers: bool = False  # the run starts (or waits for) producers on an endpoint
    # When the input limits and no producer figures say which side: what to try, and how to say what it delivered.
    input_advice: Words = "add producers (--producers) or use zmq-consume"
    delivers_words: Words = "the input delivers"
    # The table's words beside a figure the input limits (a floor, `≥ N`): who limits, and what raises it.
    floor_words: Words = "producers limit: add --producers"
    # When steps run slower than the baseline without waiting: the input's host work competes with them.
    host_cpu_advice: Words = "move input work off the trainer's cores (zmq-consume, producers on other hosts)"
    validate: Callable[[Any], None] | None = None
    checks: Mapping[str, Callable[[Any], None]] = field(default_factory=dict)  # framework -> its own check
    frameworks: tuple[str, ...] = ("tf", "torch")  # the trainers with a half of this path
    # The fields its halves add to a result (`result_fields()`): their schema, and how PyTorch's ranks merge them.
    fields: tuple[ResultField, ...] = ()

    def check(self, cfg: Any, framework: str) -> None:
        """The shared checks, then `framework`'s own (raise ConfigError)."""
        if self.validate is not None:
            self.validate(cfg)
        own = self.checks.get(framework)
        if own is not None:
            own(cfg)

    def words(self, field: str, framework: str) -> Any:
        """The field's value for `framework` (a field of words may say one thing per framework)."""
        value = getattr(self, field)
        if isinstance(value, dict):
            return value.get(framework, getattr(Declaration, field, None))
        return value

    def result_fields(self) -> dict[str, ResultField]:
        """{name: field} of the fields this path adds to its results."""
        return {f.name: f for f in self.fields}


class InputPath:
    """What every input path provides, whatever the framework.

    A framework's half names its path's `declaration` (what the path is, read
    from there: `cls.declaration.name`) and overrides what it needs. A path
    object is made per run (`cls(cfg)`), so it may keep the run's state (its
    sockets, producers, counters) and report it through the stage contract below.
    """

    declaration: ClassVar[Declaration] = Declaration(name="", summary="", order=100)
    framework: ClassVar[str] = ""  # "tf" or "torch"

    @property
    def name(self) -> str:
        """The path's name, as its declaration says (endpoints and error lines carry it)."""
        return self.declaration.name

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @classmethod
    def validate(cls, cfg: Any) -> None:
        """Refuse flags this path cannot work with, before anything starts (raise ConfigError).

        The declaration's checks: those both halves share, then this framework's own.
        """
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
        """Fields this path adds to its result (per-producer accounting, batches pulled), each declared in its
        declaration's `fields` (how ranks merge it, its schema)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What the report says about the path itself (kind, advice), next to its figures."""
        d, fw = self.declaration, self.framework
        words = {
            k: d.words(k, fw)
            for k in ("summary", "advice", "input_advice", "floor_words", "delivers_words", "host_cpu_advice")
        }
        return {
            "name": d.name,
            **words,
            "needs_producers": d.needs_producers,
            # Who makes the batches (docs/results.schema.json); "feeder" is what puts a batch on a device (feeders/).
            "batch_maker": batch_maker_of(self.cfg) if d.needs_producers else None,
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


def needs_own_work(cfg: Any, path: str, who: str, loader: str = "") -> None:
    """Refuse a path whose engine (`who`: "its pipeline does", "its workers run") does the producers' work itself
    when the run asks for other producers: only synthetic images, or decoding --data (which must name a folder),
    or (`loader`: what of one the engine runs, "tf.data pipeline") the user's --loader, which the caller checks."""
    kind = cfg.producer_kind
    if kind not in ("synthetic", "decode"):
        what = "--loader" if kind == "loader" else f"--producer-kind {kind}"
        also = f", or your --loader's {loader}" if loader else ""
        raise ConfigError(
            f"--fake-location {path} with {what}: {who} synthetic or decode work (--producer-kind synthetic|decode)"
            f"{also}"
        )
    if kind == "decode":
        needs_data(cfg, path)


def register(cls: type[InputPath]) -> type[InputPath]:
    """Class decorator: make `cls` available by its declaration's name for its framework."""
    d = cls.__dict__.get("declaration")
    if d is None or not d.name or cls.framework not in _registry:
        raise TypeError(
            f"{cls.__name__}: an input path names its Declaration (declaration = PATH) and a framework in "
            f"{sorted(_registry)}"
        )
    _registry[cls.framework][d.name] = cls
    return cls


def registered(framework: str) -> dict[str, type[InputPath]]:
    """The paths of `framework` registered so far, importing nothing (`consumers.declared.load` imports them)."""
    if framework not in _registry:
        raise ConfigError(f"--framework {framework!r}: choose from {', '.join(sorted(_registry))}")
    return dict(_registry[framework])


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
