"""The TensorFlow plugin of the harness (harness/run.py `Trainer`): tensorpack's multi-tower trainers, in process.

Each input path is one graph, trained by harness/tf/run.py:run_path in this
process; a task of a TensorFlow cluster runs through harness/tf/cluster_worker.py.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from core.config import BenchConfig
from frameworks.tf_env import import_tf
from harness.run import each_path, prepare
from harness.tf import devices


def plugin(args: argparse.Namespace) -> TFTrainer:
    return TFTrainer()


class TFTrainer:
    """TensorFlow 2 in graph mode with tensorpack: one process, a tower per device."""

    framework = "tf"

    def __init__(self) -> None:
        self.words = f"TensorFlow {import_tf().__version__}"
        self.has_gpu = False

    def gpu_count(self) -> int:
        n = devices.gpu_count()
        self.has_gpu = n > 0
        return n

    def defaults(self, cfg: BenchConfig, gpus: int) -> list[str]:
        return []

    def check(self, cfg: BenchConfig, gpus: int) -> None:
        """Nothing beyond the harness's own checks: towers share this process's memory."""

    def devices(self, cfg: BenchConfig) -> int:
        return cfg.num_gpus

    def header(self, cfg: BenchConfig, model: str, gpus: int) -> str:
        return (
            f"feedbench ({self.words}): {model}, "
            f"{cfg.num_gpus} {'GPU' if gpus else 'CPU'} tower(s) x batch {cfg.batch}, {cfg.image_size}x{cfg.image_size}, "
            f"{cfg.variable_update}, {cfg.warmup_steps} warm-up + {cfg.repeats} x {cfg.steps} steps"
        )

    def describe(self) -> dict[str, Any]:
        return devices.describe()

    def config_fields(self) -> dict[str, Any]:
        return {}

    def run(self, cfg: BenchConfig) -> dict[str, dict]:
        from harness.tf.run import run_path

        return each_path(cfg, lambda c, path: run_path(c, path, self.has_gpu))

    def run_in_turn(self, cfg: BenchConfig) -> list[dict]:
        from harness.tf.run import run_path

        return [run_path(replace(cfg, paths=[path]), path, self.has_gpu) for path in cfg.paths]

    def how_to_open(self, profile_dir: str) -> str:
        from harness.tf.tracing import how_to_open

        return how_to_open(profile_dir)

    def run_task(self, cfg: BenchConfig, task) -> int:
        """A task of a TensorFlow cluster (docs/cluster.md): a parameter server, or a worker's run and report."""
        from harness.tf.cluster_worker import run_task

        if task.job_name == "ps":  # serves variables: no towers, no device checks
            return run_task(cfg, task, False, self)
        gpus = self.gpu_count()
        for note in prepare(self, cfg, gpus):
            print(f"note: {note}")
        return run_task(cfg, task, gpus > 0, self)
