"""The input paths a test covers, read from their declarations (`consumers/<path>/path.py`).

A test about every path with some property (in the default run, fed by producers) takes its list from here, so a
new path is tested wherever it has that property and no test module spells out a list to keep in step.
"""

from __future__ import annotations

from consumers import declared


def default_paths(framework: str = "tf") -> list[str]:
    """The paths `framework` compares when no --fake-location picks one, baseline first, in table order."""
    return declared.default_run(framework)


def producer_paths(framework: str = "tf") -> list[str]:
    """The default run's paths fed by producers on an endpoint (`needs_producers`), in table order."""
    paths = declared.of(framework)
    return [name for name in declared.default_run(framework) if paths[name].needs_producers]
