"""Every input path of a framework as its declaration says, without importing that framework.

What the command line needs before anything heavy loads (the --fake-location
choices and their help, the default run): a bad flag is refused in a moment,
and a PyTorch run's own process need not import TensorFlow, nor the reverse.
The framework's classes (core.registry.load) take the same identity from the
same declarations; a class registered before the call (a path defined outside
the project) counts too.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import consumers
from core import registry


@dataclass(frozen=True)
class DeclaredPath:
    """A path's identity for one framework: what the CLI and the default run read."""

    name: str
    summary: str
    order: int
    in_default_run: bool
    needs_producers: bool


def declarations() -> list[registry.Declaration]:
    """Each `consumers/<path>/path.py`'s PATH, in folder order."""
    found = []
    for info in pkgutil.iter_modules(consumers.__path__):
        if info.ispkg:
            module = importlib.import_module(f"consumers.{info.name}.path")
            found.append(module.PATH)
    return found


def import_halves(framework: str) -> None:
    """Import every half of `framework` (`consumers/<path>/<framework>.py`), registering its input paths.

    `core.registry.load` calls it: a new path is a new folder, found here.
    """
    for info in pkgutil.iter_modules(consumers.__path__):
        if info.ispkg and (Path(consumers.__path__[0]) / info.name / f"{framework}.py").is_file():
            importlib.import_module(f"consumers.{info.name}.{framework}")


def declared(framework: str) -> dict[str, DeclaredPath]:
    """{name: its identity} for `framework`, in table order (the order registry.load gives its classes)."""
    paths = {
        d.name: DeclaredPath(d.name, d.words("summary", framework), d.order, d.in_default_run, d.needs_producers)
        for d in declarations()
        if framework in d.frameworks
    }
    for name, cls in registry.registered(framework).items():
        paths[name] = DeclaredPath(name, cls.summary, cls.order, cls.in_default_run, cls.needs_producers)
    return dict(sorted(paths.items(), key=lambda kv: (kv[1].order, kv[0])))


def check_declared(cfg, framework: str) -> None:
    """Each chosen path's checks, before any framework loads (ConfigError): its declaration's, shared and
    `framework`'s own; a path registered in this process without a declaration checks itself."""
    by_name = {d.name: d for d in declarations()}
    registered = registry.registered(framework)
    for name in cfg.paths:
        d = by_name.get(name)
        if d is not None:
            d.check(cfg, framework)
        elif name in registered:
            registered[name].validate(cfg)
