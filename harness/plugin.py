"""What a framework plugin provides: the `Trainer` protocol, and how the CLI finds one by name."""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from core.config import BenchConfig
from core.errors import ConfigError

# Where each framework's plugin lives; importing it is the only place a framework is loaded.
PLUGINS = {"tf": "harness.tf.plugin", "torch": "harness.torch.plugin"}


class Trainer(Protocol):
    """A framework plugin, as the harness (harness/run.py) drives it.

    The harness owns the run: it applies the machine's defaults, checks the
    configuration, prints the table and verdicts and writes the files. The
    plugin only knows its framework: how many devices it sees, what it adds
    to the defaults, and how to train a list of input paths.
    """

    framework: str  # "tf" or "torch", as in --framework and the registry
    words: str  # "TensorFlow 2.21.0": how the header and the JSON name the trainer

    def gpu_count(self) -> int:
        """The GPUs this framework can use (0 on a CPU machine); refuses (ConfigError) a GPU it cannot see."""
        ...

    def defaults(self, cfg: BenchConfig, gpus: int) -> list[str]:
        """The plugin's own defaults on top of core.config.apply_defaults, as notes for the user."""
        ...

    def check(self, cfg: BenchConfig, gpus: int) -> None:
        """Refuse (ConfigError) a grid point this machine cannot run, before anything starts."""
        ...

    def devices(self, cfg: BenchConfig) -> int:
        """Devices trained in one run of `cfg` (towers, or ranks on every node)."""
        ...

    def header(self, cfg: BenchConfig, model: str, gpus: int) -> str:
        """The run's first line: the trainer, `model` (the model's words), devices, batch and schedule."""
        ...

    def describe(self) -> dict[str, Any]:
        """The machine and the framework's versions, for the report's `device` block."""
        ...

    def config_fields(self) -> dict[str, Any]:
        """Fields the framework adds to the report's `config` (e.g. nodes)."""
        ...

    def run(self, cfg: BenchConfig) -> dict[str, dict] | None:
        """Train every path of `cfg.paths` in turn; {path: result}, or None where another process reports."""
        ...

    def how_to_open(self, profile_dir: str) -> str:
        """What to type to look at a --profile folder."""
        ...


def load(framework: str, args: Any) -> Trainer:
    """The plugin of `framework` (importing its framework), for the parsed flags `args`."""
    if framework not in PLUGINS:
        raise ConfigError(f"--framework {framework!r}: choose from {', '.join(sorted(PLUGINS))}")
    return importlib.import_module(PLUGINS[framework]).plugin(args)
