"""What a TensorFlow input path provides on top of core.registry.InputPath.

A path object is made per run. `build` gives the tensorpack InputSource the
trainer reads each tower's batch from (wrapped in a StagingArea per device
unless the path says its data is already there); `open` binds what must be
bound before producers start; `start` starts what it feeds from and `stop`
stops it (its producers, as a PyTorch rank's path does); `callbacks` give it
its own monitoring, and the stage contract of core.registry.InputPath
(`counters`, `sampled_stages`, `producer_figures`, `result_fields`) is how it
reports raw state, which profiler.telemetry.stage_figures turns into figures;
`close` releases what it opened. Paths with producers take the run's
endpoint and read their producers' figures from their group (`producers`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from tensorpack.callbacks import Callback
from tensorpack.input_source import InputSource

from core.registry import InputPath
from feeders.tf import Staging
from profiler.telemetry import stats_file_figures
from runner.producer_group import ProducerGroup, start_producers

NUM_CLASSES = 1000


class TFInputPath(InputPath):
    framework: ClassVar[str] = "tf"
    staged: ClassVar[bool] = True  # stage each tower's batch onto its device (StagingInput)
    # Ops of this path that block a step while no batch is ready, beyond the staging's own (telemetry).
    input_op_types: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: Any, endpoint: str | None = None) -> None:
        super().__init__(cfg)
        self.endpoint = endpoint
        self.staging: Staging | None = None
        self.producers: ProducerGroup | None = None  # what `start` started

    # --- building the graph ----------------------------------------------------------------------
    def input_source(self, specs: list, has_gpu: bool) -> InputSource:
        """The path's own InputSource for tensors shaped like `specs` (the model's signature, batch filled)."""
        raise NotImplementedError

    def build(self, specs: list, has_gpu: bool) -> InputSource:
        """The InputSource the trainer reads, staged onto each device unless `staged` is False."""
        source = self.input_source(specs, has_gpu)
        if not self.staged:
            return source
        self.staging = Staging()
        return self.staging.wrap(source)

    # --- running ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Bind what producers connect to, before they start (the Python paths' sockets)."""

    def start(self, folder: str | None) -> ProducerGroup | None:
        """Start what the path feeds from, once `open` has bound what it connects to: the run's producers
        (their stats files in `folder`), as a PyTorch rank's path starts its share (consumers/torch_half.py).
        A path that starts processes of its own instead (tf-data-service) has them in `producers` by now."""
        if self.declaration.needs_producers:
            self.producers = start_producers(self.cfg, self.endpoint, folder)
            if self.producers is not None:  # a feeding thread waiting for a batch stops waiting when one fails
                self.producers.on_failure(self.interrupt)
        return self.producers

    def stop(self) -> None:
        """Stop what `start` started, before `close` releases the sockets it fed."""
        if self.producers is not None:
            self.producers.stop()

    def callbacks(self) -> list[Callback]:
        """Callbacks the path needs in the training session (its own counters, checks)."""
        return []

    def sampled_stages(self) -> list:
        """Stages whose figures are fetched with every measured step (queue, staging): telemetry samples them."""
        return [self.staging] if self.staging is not None else []

    def producer_figures(self, window: tuple[dict, dict] | None) -> dict | None:
        """What the producers did over the measured window; by default from their own stats files."""
        if self.producers is None:
            return None
        stats = self.producers.stats()
        return stats_file_figures(list(range(len(stats))), stats, self.cfg.batch)

    def failure(self) -> str | None:
        """Why the input stopped, in the path's own words, when it knows (a wire error, a timeout)."""
        return None

    def interrupt(self) -> None:
        """Stop waiting for input at once (called from another thread when the producers have failed)."""

    def close(self) -> None:
        """Release what `open` and `build` took (sockets); called once, whatever happened."""


def random_batch(specs: list, seed: int = 0) -> list[np.ndarray]:
    """A random batch shaped like `specs`: rank-1 tensors are labels in [0, 1000), others pixels in [0, 256)."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, NUM_CLASSES if len(s.shape) == 1 else 256, tuple(s.shape), dtype=s.dtype.as_numpy_dtype)
        for s in specs
    ]
