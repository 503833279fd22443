"""Step timing on each rank, and one result for the whole run from every rank's figures.

The same method as the TensorFlow trainer (DLPerf / tf_cnn_benchmarks): skip
the warm-up steps, then time `repeats` windows of `steps` steps; each window
ends with a device synchronize, so queued GPU work is inside the window that
launched it. Images/s of a window counts every rank's images over the slowest
rank's wall time; the figures are the median with min and max.

Input wait is the time the device sat idle waiting for the batch. On a GPU
two CUDA events on the step's stream frame the hand-over: one recorded before
`next()` (done when the previous step's work is), one after it (done when the
stream's wait for the batch's copy is over too); their distance, read at the
window's end when both are long done, is the device's wait, with no sync per
step. The host's time inside `next()` would count a wait for a batch while
the device is still busy with queued work. On the CPU the device is the host:
the time spent blocked in `next()` (two clock reads).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from profiler import first_batch
from profiler.summary import Summary
from profiler.training import merge_ranks, skipped_steps, training_block
from profiler.uncertainty import STEP_BATCHES, window_rate

INITIAL_SCALE = 2.0**16  # torch.amp.GradScaler's init_scale, as harness/torch/run.py makes it


def synchronize(device: torch.device) -> None:
    """Wait for all work queued on `device` (a no-op on the CPU, where every op has finished on return)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class RankTimer:
    """What one rank saw: step start/end times, input waits and losses (as tensors, read once at the end)."""

    warmup: int
    steps: int
    repeats: int
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    losses: list = field(default_factory=list)
    window_walls: list[float] = field(default_factory=list)
    device_marks: list = field(default_factory=list)  # (event before next(), event after) per step, CUDA only
    opened: float | None = None  # the path's input opening (profiler/first_batch.py)
    first_batch_at: float | None = None  # next() returned the first batch

    @staticmethod
    def mark(cuda: bool):
        """A timing event recorded on the current stream (None on the CPU)."""
        if not cuda:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    @property
    def needed(self) -> int:
        return self.warmup + self.steps * self.repeats

    def timed(self) -> list[range]:
        """Each timed window's steps."""
        return [range(self.warmup + r * self.steps, self.warmup + (r + 1) * self.steps) for r in range(self.repeats)]

    def window_end(self, step: int) -> bool:
        """Whether `step` (0-based) is the last of a timed window, or of the warm-up."""
        return step == self.warmup - 1 or (step >= self.warmup and (step - self.warmup + 1) % self.steps == 0)

    def close_window(self, step: int) -> None:
        """Called after `synchronize` at a window's last step: records the window's wall time."""
        if step >= self.warmup:
            first = step - self.steps + 1
            self.window_walls.append(self.ends[step] - self.starts[first])
        # Every event of the window is done: the device's waits replace the host's.
        for i, (before, after) in enumerate(self.device_marks):
            if before is not None:
                self.waits[i] = before.elapsed_time(after) / 1e3
                self.device_marks[i] = (None, None)

    def figures(self, scales: list[float] | None = None) -> dict:
        """This rank's plain figures, small enough to gather from every rank.

        `scales`: a dynamic loss scaler's scale after each step (its initial scale is torch's, 2**16).
        """
        losses = [float(x) for x in self.losses]
        skipped = skipped_steps(scales, INITIAL_SCALE) if scales else None
        m = slice(self.warmup, self.needed)
        walls = np.array(self.ends[m]) - np.array(self.starts[m])
        waits = np.array(self.waits[m])
        return {
            "steps_run": len(self.ends),
            "window_walls": self.window_walls,
            "step_ms": (walls * 1e3).tolist(),
            "wait_ms": (waits * 1e3).tolist(),
            "final_loss": losses[-1] if losses else float("nan"),
            "loss_finite": bool(losses) and all(math.isfinite(x) for x in losses),
            "training": training_block(losses, self.timed(), scales or None, skipped),
            "first_batch_s": self.first_batch_at - self.opened,
            "step_ends": list(self.ends),  # perf_counter: CLOCK_MONOTONIC, the parent's clock too
            "window_spans": [
                [self.starts[a], self.ends[a + self.steps - 1]]
                for a in range(self.warmup, self.needed - self.steps + 1, self.steps)
                if a + self.steps <= len(self.ends)
            ],
        }


def _percentiles(ms: list[float]) -> dict:
    a = np.array(ms) if ms else np.zeros(1)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def wait_share(rank: dict) -> float | None:
    total = sum(rank["step_ms"])
    return min(1.0, sum(rank["wait_ms"]) / total) if total > 0 else None


def _rates(images: int, walls: list[float], steps: int) -> list[float]:
    """Each window's images/s (profiler/uncertainty.py `window_rate`: the one place a window's time divides)."""
    rates = [window_rate(images, w, steps, need=STEP_BATCHES) for w in walls]
    if None in rates:
        raise RuntimeError(f"a timed window measured no time ({steps} steps)")
    return rates


def combine(ranks: list[dict], batch: int, steps: int) -> dict:
    """One result (the TensorFlow trainer's schema) from every rank's `figures()` plus its identity fields."""
    world = len(ranks)
    repeats = min(len(r["window_walls"]) for r in ranks)
    if repeats == 0:
        raise RuntimeError("no timed window completed")
    total = Summary.of(_rates(world * batch * steps, [max(r["window_walls"][i] for r in ranks) for i in range(repeats)],
                              steps))  # fmt: skip
    per_rank = []
    for r in ranks:
        share = wait_share(r)
        per_rank.append(
            {
                "rank": r["rank"],
                "host": r["host"],
                "device": r["device"],
                "images_per_sec": Summary.of(_rates(batch * steps, r["window_walls"], steps)).to_dict(),
                "input_wait_share": share,
                "input_wait_ms_mean": statistics.mean(r["wait_ms"]) if r["wait_ms"] else None,
                "step_time_ms": _percentiles(r["step_ms"]),
                "final_loss": r["final_loss"],
                "first_batch_s": r["first_batch_s"],
            }
        )
    # Every rank's measured steps together: the run's input share, as the TensorFlow profiler defines it.
    all_wait = [w for r in ranks for w in r["wait_ms"]]
    all_step = sum(sum(r["step_ms"]) for r in ranks)
    telemetry = {
        "sampled_steps": len(ranks[0]["step_ms"]),
        "sample_every": 1,
        "input_wait_ms": {"mean": statistics.mean(all_wait), "max": max(all_wait)} if all_wait else None,
        "input_wait_share": min(1.0, sum(all_wait) / all_step) if all_step > 0 else None,
        "per_rank": [
            {
                "rank": p["rank"],
                "input_wait_share": p["input_wait_share"],
                "input_wait_ms_mean": p["input_wait_ms_mean"],
            }
            for p in per_rank
        ],
    }
    from profiler.cluster_report import rank_straggler

    straggler = rank_straggler(per_rank) if world > 1 else None
    return {
        "images_per_sec": total.to_dict(),
        "images_per_sec_per_device": total.scaled(1 / world).to_dict(),
        "step_time_ms": _percentiles(ranks[0]["step_ms"]),
        "final_loss": ranks[0]["final_loss"],
        "loss_finite": all(r["loss_finite"] for r in ranks),
        "training": merge_ranks([r["training"] for r in ranks]),
        "steps_run": min(r["steps_run"] for r in ranks),
        "ranks": per_rank,
        "straggler": straggler,
        "telemetry": telemetry,
        "first_batch": first_batch.figure(
            "torch", max(p["first_batch_s"] for p in per_rank), [p["first_batch_s"] for p in per_rank]
        ),
        "clock": clock(ranks, batch),
    }


def clock(ranks: list[dict], batch: int) -> dict:
    """The run's step clock for its timeline (profiler/timeline.py): every rank's step ends, each window
    from the first rank's start to the last rank's end, and the queue each step found (where the path has
    one). Only the ranks of rank 0's machine: other machines' clocks are their own."""
    local = [r for r in ranks if r.get("host") == ranks[0].get("host")]  # rank 0's machine writes the timeline
    spans = [r.get("window_spans") or [] for r in local]
    n = min(len(s) for s in spans)
    return {
        "step_ends": sorted(t for r in local for t in r.get("step_ends", [])),
        "images_per_step": batch,
        "windows": [[min(s[i][0] for s in spans), max(s[i][1] for s in spans)] for i in range(n)],
        "queue": sorted(pair for r in local for pair in zip(r.get("step_ends", []), r.get("queue_sizes") or [])),
    }
