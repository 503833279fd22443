"""Every input path by name, found from its folder: its declaration, its halves, what the run and the schema read.

A path is a folder `consumers/<path>/` (in this project, or in a `consumers/`
folder of another place on sys.path: the package's path is extended the
way pkgutil does). What the command line needs before anything heavy loads
(the --fake-location choices and their help, the default run) comes from the
declarations (`path.py`) alone: a bad flag is refused in a moment, and a
PyTorch run's own process need not import TensorFlow, nor the reverse. `load`
imports a framework's halves (`tf.py`, `torch.py`), which register their
classes; a class registered before the call (a path defined outside any
folder) counts too.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import consumers
from core import registry
from core.errors import ConfigError
from core.registry import Declaration, InputPath, batch_maker_of
from core.result_fields import ResultField


def _folders() -> list[tuple[str, Path]]:
    """(package name, folder) of every path folder on the consumers package's path, in name order."""
    found = {}
    for info in pkgutil.iter_modules(consumers.__path__):
        folder = Path(info.module_finder.path) / info.name
        if info.ispkg and info.name not in found and (folder / "path.py").is_file():
            found[info.name] = folder
    return sorted(found.items())


def declarations() -> list[Declaration]:
    """Each `consumers/<path>/path.py`'s PATH, in folder order."""
    return [importlib.import_module(f"consumers.{name}.path").PATH for name, _ in _folders()]


def import_halves(framework: str) -> None:
    """Import every half of `framework` (`consumers/<path>/<framework>.py`), registering its input paths."""
    for name, folder in _folders():
        if (folder / f"{framework}.py").is_file():
            importlib.import_module(f"consumers.{name}.{framework}")


def of(framework: str) -> dict[str, Declaration]:
    """{name: its declaration} of every path `framework` has, in table order (the order `load` gives its classes)."""
    paths = {d.name: d for d in declarations() if framework in d.frameworks}
    for name, cls in registry.registered(framework).items():
        paths[name] = cls.declaration
    return dict(sorted(paths.items(), key=lambda kv: (kv[1].order, kv[0])))


def load(framework: str) -> dict[str, type[InputPath]]:
    """Every path of `framework`, its halves imported first, in table order."""
    if framework not in registry.FRAMEWORKS:
        raise ConfigError(f"--framework {framework!r}: choose from {', '.join(registry.FRAMEWORKS)}")
    import_halves(framework)
    return dict(sorted(registry.registered(framework).items(), key=lambda kv: (kv[1].declaration.order, kv[0])))


def get(framework: str, name: str) -> type[InputPath]:
    """The class of path `name` for `framework` (ConfigError naming the choices)."""
    paths = load(framework)
    if name not in paths:
        raise ConfigError(
            f"--fake-location {name!r}: no such input path for {framework} (choose from {', '.join(paths)})"
        )
    return paths[name]


def names(framework: str) -> list[str]:
    """Every path of `framework`, in table order, from the declarations (the framework is not imported)."""
    return list(of(framework))


def default_run(framework: str) -> list[str]:
    """The paths a run compares when no --fake-location picks one (`in_default_run`), in table order."""
    return [n for n, d in of(framework).items() if d.in_default_run]


def check_declared(cfg: Any, framework: str) -> None:
    """Each chosen path's checks, before any framework loads (ConfigError): its declaration's, shared and
    `framework`'s own."""
    known, classes = of(framework), registry.registered(framework)
    for name in cfg.paths:
        if name in classes:  # registered in this process: its class checks (its declaration's checks, by default)
            classes[name].validate(cfg)
        elif name in known:
            known[name].check(cfg, framework)


def batch_maker_line(cfg: Any, framework: str) -> str | None:
    """The run's line saying who feeds its producer-fed paths (None when no chosen path takes producers)."""
    known = of(framework)
    if not any(known[n].needs_producers for n in cfg.paths if n in known):
        return None
    f = batch_maker_of(cfg)
    if f["kind"] == "external":
        return f"producers: {f['name']}"
    return f"producers: {f['name']}, {cfg.producers} process(es) x {cfg.producer_workers} worker(s)"


def result_fields() -> dict[str, ResultField]:
    """Every declared path's own result fields, of both frameworks (ValueError where two paths disagree)."""
    out: dict[str, ResultField] = {}
    paths = {n: d for fw in registry.FRAMEWORKS for n, d in of(fw).items()}
    for d in paths.values():
        for f in d.fields:
            if f.name in out and out[f.name].properties() != f.properties():
                raise ValueError(f"result field {f.name!r}: {d.name} declares it unlike another path does")
            out[f.name] = f
    return out


def results_schema(schema: dict) -> dict:
    """`schema` (docs/results.schema.json) with every declared field as a property of a path's result.

    The file holds what every result has; each path's own fields come from its declaration, so a new
    path needs no edit of the file, and `additionalProperties: false` still refuses a field nobody declared.
    """
    out = copy.deepcopy(schema)
    props = out["$defs"]["path_result"]["properties"]
    for f in result_fields().values():
        for name, prop in f.properties().items():
            if name in props and props[name] != prop:
                raise ValueError(f"result field {name!r} is in docs/results.schema.json already, differently")
            props[name] = prop
    return out
