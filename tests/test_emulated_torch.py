"""PyTorch's emulated device runs a step while the host goes on, as a GPU does.

On an H200 machine (docs/gpu.md) the `cpu` path, which makes each batch on the step's own thread, kept up
with no demand at all in a capacity search: the emulated step slept on that thread, so generation and the
device's step added up instead of overlapping, and a smaller batch (a lower demand) only made it worse.
"""

from __future__ import annotations

import time

import pytest
import torch

from models.torch import EmulatedDevice

RATE, BATCH = 10.0, 20  # a step of 2 s: the host's own work between calls is far shorter


def batch() -> torch.Tensor:
    return torch.zeros((BATCH, 8, 8, 3), dtype=torch.uint8)


@pytest.mark.timeout(60)
def test_the_step_is_under_way_when_forward_returns_and_the_next_waits_for_it() -> None:
    dev = EmulatedDevice(RATE)
    dev(batch())
    first_due = dev._due
    assert time.perf_counter() < first_due  # the host goes on while the device consumes the batch
    dev(batch())  # the device is busy: the next batch is taken once the step under way has ended
    assert time.perf_counter() >= first_due
    assert dev.idle == 0.0  # it was handed the next batch the moment it was free
    dev.finish()
    assert time.perf_counter() >= first_due + BATCH / RATE


@pytest.mark.timeout(60)
def test_a_batch_that_comes_late_is_counted_as_the_devices_idle_time() -> None:
    dev = EmulatedDevice(RATE)
    dev(batch())
    dev.finish()
    time.sleep(1.0)  # half a step with nothing to do: more than the schedule's slack of a tenth
    dev(batch())
    assert dev.idle >= 1.0
