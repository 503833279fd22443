"""`--profile DIR` with --framework torch: a torch.profiler trace of a few untimed steps after the timed windows.

Each rank writes one file per input path, `DIR/<path>/rank<r>.pt.trace.json`,
a Chrome trace that opens as it is in https://ui.perfetto.dev or
chrome://tracing, and that TensorBoard's PyTorch profiler plugin
(`torch-tb-profiler`) reads as run `<path>` with one worker per rank. The
steps run after every timed window and after the path's figures are taken,
so the trace changes no figure of the run.

The input's stages are named ranges in the trace:

- `feedbench.input.<path>`: the step's `next()`, the batch as the step gets it;
- inside it and on the feeding threads, the stages a path has:
  `feedbench.wait` (the step waits for a batch another thread or process
  prepares), `feedbench.receive` (off the wire), `feedbench.generate`,
  `feedbench.load` (the user's loader, SPDL's pipeline), `feedbench.decode`,
  `feedbench.host_copy` (into pinned host memory), `feedbench.copy_to_device`
  (the host-to-device copy is queued);
- `feedbench.normalize` and `feedbench.step` (forward, backward, optimizer).

The paths and feeders open their ranges through `frameworks.torch_trace.stage`,
which costs a flag read while no profiler records.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

WARMUP_STEPS = 1  # the profiler runs but keeps nothing: its own start-up stays out of the trace
ACTIVE_STEPS = 3
PROFILED_STEPS = WARMUP_STEPS + ACTIVE_STEPS


def trace_file(logdir: str, path: str, rank: int) -> str:
    """Where rank `rank` writes the trace of input path `path`."""
    return os.path.join(logdir, path, f"rank{rank}.pt.trace.json")


def _all_threads_config():
    """Record the feeding threads' ranges too (by default only the thread that starts the profiler)."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):  # an older or newer torch: the step's own thread only
        return None


class ProfileSteps:
    """PROFILED_STEPS untimed training steps of one path under torch.profiler, written as one trace per rank."""

    def __init__(self, logdir: str, path: str, rank: int, device: torch.device) -> None:
        self.path = path
        self.rank = rank
        self.device = device
        self.file = trace_file(logdir, path, rank)
        self.written: list[str] = []

    def _write(self, prof: profile) -> None:
        os.makedirs(os.path.dirname(self.file), exist_ok=True)
        tmp = f"{self.file}.tmp{os.getpid()}"  # no *.pt.trace.json name until it is whole
        try:
            prof.export_chrome_trace(tmp)
            os.replace(tmp, self.file)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        self.written.append(self.file)

    def run(
        self,
        next_batch: Callable[[], tuple[Any, Any]],
        normalize: Callable[[Any], Any],
        train_step: Callable[[Any, Any], Any],
        check: Callable[[], None],
    ) -> list[str]:
        """Run the steps: `next_batch()`, `normalize(images)`, `train_step(x, labels)`, then `check()`.

        Returns the files written (the trace, once the last step's device work is in it).
        """
        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        if not cuda:  # kineto's spurious "gpuGetDeviceCount failed" line with a CUDA build on a CPU rank
            os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        prof = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=WARMUP_STEPS, active=ACTIVE_STEPS, repeat=1),
            on_trace_ready=self._write,
            record_shapes=False,
            with_stack=False,
            profile_memory=False,
            experimental_config=_all_threads_config(),
        )
        with prof:
            for i in range(PROFILED_STEPS):
                with record_function(f"feedbench.input.{self.path}"):
                    images, labels = next_batch()
                with record_function("feedbench.normalize"):
                    x = normalize(images)
                with record_function("feedbench.step"):
                    train_step(x, labels)
                if i == PROFILED_STEPS - 1 and cuda:
                    torch.cuda.synchronize(self.device)  # the last step's kernels belong in the trace
                check()
                prof.step()
        return self.written


def how_to_open(logdir: str) -> str:
    """What to type to look at a --profile folder written by the PyTorch trainer (what needs what)."""
    return (
        f"profile traces in {logdir} (one per input path and rank):\n"
        f"  {logdir}/<path>/rank<r>.pt.trace.json    (open in https://ui.perfetto.dev or chrome://tracing)\n"
        f"  tensorboard --logdir {logdir}    (PyTorch Profiler tab; needs: pip install tensorboard torch-tb-profiler)"
    )
