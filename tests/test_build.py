"""`harness.tf.run.build`: a run's graph, per path, without training it, binding anything or starting producers."""

from __future__ import annotations

import inspect
import os

import pytest

from consumers import declared
from core.config import BenchConfig, apply_defaults
from core.registry import BASELINE
from harness.tf.run import build

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("path", declared.default_run("tf"))
def test_build_puts_each_tower_on_its_own_device_and_binds_nothing(path, ipc_dir):
    cfg = BenchConfig(batch=2, image_size=32, input_only=True, producers=1)
    apply_defaults(cfg, gpus=0)
    built = build(cfg, path, num_gpus=2, has_gpu=False, endpoint=f"ipc://{ipc_dir}/feed")
    assert built.cfg.num_gpus == 2 and built.path.name == path
    placed = {op.device.upper() for op in built.graph.get_operations() if op.name.startswith("tower1/") and op.device}
    assert placed and all("CPU:1" in d for d in placed), placed  # without a GPU: tower k on virtual CPU k
    assert not os.listdir(ipc_dir), "building must not bind the endpoint"
    assert built.path.producers is None


def test_each_path_lives_in_its_own_file():
    # Paths registered from outside the project (tests/test_extra_path.py does) are not the project's.
    ours = [n for n in declared.names("tf") if declared.get("tf", n).__module__.startswith("consumers.")]
    assert BASELINE in ours and len(ours) >= 6
    for name in ours:
        where = inspect.getfile(declared.get("tf", name))
        assert where.endswith(os.path.join("consumers", name.replace("-", "_"), "tf.py")), (name, where)
