"""Put every received batch into a StagingArea on its tower's device.

With staging, step k trains on the batch copied to the device during step
k-1, so the host-to-device copy overlaps compute, as in tensorflow/benchmarks.
The on-device baseline needs no staging: its data never moves.
"""

from __future__ import annotations

from tensorpack.input_source import FeedfreeInput, InputSource, QueueInput, StagingInput


def stage_onto_devices(source: InputSource, stages: int = 1) -> InputSource:
    """Wrap a feed-free input so each tower unstages a batch prefetched onto its device."""
    if not isinstance(source, (FeedfreeInput, QueueInput)):
        raise TypeError(f"cannot stage {type(source).__name__}: it is not a feed-free input")
    return StagingInput(source, nr_stage=stages)
