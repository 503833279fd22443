"""What --loader-only says about a real torch DataLoader: the CPU of every worker it starts, and a worker's error.

Real processes: `bench_input.py --loader-only` runs the loaders below in its own
worker processes, which run PyTorch's DataLoader workers in theirs.
"""

from __future__ import annotations

import json

import pytest

from tests.test_loader import finish, start

pytestmark = pytest.mark.timeout(300)

BURN = 0.02  # CPU seconds each sample costs in a DataLoader worker

LOADERS = f"""
import time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

BURN = {BURN}


class Burn(Dataset):
    '''Four samples, each costing BURN CPU seconds in the worker that makes it.'''

    def __len__(self):
        return 4

    def __getitem__(self, i):
        t0 = time.thread_time()
        while time.thread_time() - t0 < BURN:
            pass
        return torch.zeros((8, 8, 3), dtype=torch.uint8), i


class Broken(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise RuntimeError("sample 3 is corrupt")
        return torch.zeros((8, 8, 3), dtype=torch.uint8), i


def burn(persistent=False):
    # Two batches a pass: without persistent workers, the worker exits and a new one starts every 2 batches.
    return DataLoader(Burn(), batch_size=2, num_workers=1, persistent_workers=persistent)


def broken():
    return DataLoader(Broken(), batch_size=2, num_workers=1)
"""


@pytest.fixture(scope="module")
def loaders(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("loaders") / "torch_loaders.py"
    path.write_text(LOADERS)
    return str(path)


def run(*args: str, timeout: float = 240) -> tuple[int, str, str]:
    """bench_input.py in its own session; killed with everything it started if it overruns."""
    return finish(start("bench_input.py", *args), timeout)


@pytest.mark.timing
@pytest.mark.parametrize("persistent", [False, True])
def test_every_dataloader_worker_is_counted_persistent_or_not(loaders, tmp_path, persistent):
    """Each image costs BURN CPU seconds in a DataLoader worker: the cores reported must account for them.

    Without persistent workers the worker of each pass has exited by the next snapshot; its CPU is still
    the loader's (counted in the process that reaped it).
    """
    js = tmp_path / "loader.json"
    code, _, err = run(
        "--loader", f"{loaders}:burn", "--loader-arg", f"persistent={persistent}", "--loader-only",
        "--loader-workers", "1", "--loader-seconds", "3", "--no-stages", "--json", str(js),
    )  # fmt: skip
    assert code == 0, err
    point = json.loads(js.read_text())["points"][0]
    assert point["images_per_sec"] > 0
    cpu_per_image = point["cpu_cores"] / point["images_per_sec"]
    # At least the CPU the samples cost (less a margin for the window's edges); the loader's own
    # bookkeeping only adds to it.
    assert cpu_per_image >= 0.8 * BURN, (
        f"{point['cpu_cores']:.2f} cores at {point['images_per_sec']:.1f} img/s is {cpu_per_image * 1e3:.1f} ms "
        f"of CPU an image; each costs {BURN * 1e3:.0f} ms in a DataLoader worker"
    )


def test_a_dataloader_workers_error_keeps_its_cause_and_where_it_was_raised(loaders):
    code, _, err = run(
        "--loader", f"{loaders}:broken", "--loader-only", "--loader-workers", "1", "--loader-seconds", "2",
        "--loader-timeout", "30", "--no-stages", timeout=120,
    )  # fmt: skip
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err
    line = lines[0]
    assert "RuntimeError in DataLoader worker process 0" in line, line
    assert "RuntimeError: sample 3 is corrupt" in line, line
    assert f"(at {loaders}:" in line and "in __getitem__)" in line, line
    assert "Traceback" not in err
