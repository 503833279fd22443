"""Whether a path's model trained: each timed window's loss, loss scale and skipped updates, and the verdict on them.

A timed step whose loss is not finite, or whose update a loss scaler skipped
(its gradients were not finite), is not the step a user's training runs: a
result holding one gives no figure (docs/profiling.md, "A model that trains").
Both trainers hand their per-step losses, and under a dynamic loss scaler each
step's scale after its update, to `training_block`; the table, the verdict,
`make gpu-check` and `profiler.compare` read `invalid_reason`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The share of the base learning rate at `step` (0-based): linear over the warm-up steps, then 1.

    Goyal et al., "Accurate, Large Minibatch SGD" (gradual warm-up), as MLPerf's ResNet-50 reference does:
    a randomly initialised ResNet-50's first gradients are large, and the full rate at step 0 throws its
    weights far enough that float16 activations overflow within a few steps.
    """
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def base_learning_rate(given: float | None, total_batch: int) -> float:
    """The rate after warm-up: --learning-rate, else the linear scaling rule (0.1 per 256 images, Goyal et al.)."""
    return given if given is not None else 0.1 * total_batch / 256


def skipped_steps(scales: Sequence[float], initial: float) -> list[bool]:
    """Which steps a dynamic loss scaler skipped, from its scale after each step: a skip lowers the scale.

    A scaler only lowers its scale when it found non-finite gradients and skipped the update (it raises it
    after a run of good steps), so a step whose scale is below the one before it was skipped.
    """
    out, before = [], initial
    for s in scales:
        out.append(s < before)
        before = s
    return out


def training_block(
    losses: Sequence[float],
    timed: Sequence[range],
    scales: Sequence[float] | None = None,
    skipped: Sequence[bool] | None = None,
    loss_scale: float | None = None,
) -> dict:
    """Per timed window: whether every loss was finite, the loss scale at its end and its skipped steps.

    `losses` holds every step from the first warm-up step on, `timed` each window's steps (harness/schedule.py);
    `scales` (the scale after each step's update) and `skipped` only where a dynamic loss scaler runs,
    `loss_scale` where a static one does. `invalid` says why the run is not valid, or is None.
    """
    windows = []
    for w in timed:
        got = [losses[i] for i in w if i < len(losses)]
        finite = sorted(x for x in got if math.isfinite(x))
        windows.append(
            {
                "loss_finite": bool(got) and len(finite) == len(w),
                "loss_median": finite[len(finite) // 2] if finite else None,
                "loss_scale": float(scales[w[-1]]) if scales and w[-1] < len(scales) else loss_scale,
                "skipped_steps": sum(bool(skipped[i]) for i in w if i < len(skipped)) if skipped else 0,
            }
        )
    bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    skip = next((i for w in timed for i in w if skipped and i < len(skipped) and skipped[i]), None)
    return {
        "windows": windows,
        "first_non_finite_step": None if bad is None else bad + 1,
        "first_skipped_step": None if skip is None else skip + 1,
        "invalid": _reason(windows, bad, skip, skipped),
    }


def _reason(windows: list[dict], bad: int | None, skip: int | None, skipped: Sequence[bool] | None) -> str | None:
    """Why the timed windows do not hold a model that trains (steps counted from 1, warm-up included), or None."""
    if not windows:
        return None
    if not all(w["loss_finite"] for w in windows):
        at = "" if bad is None else f" from step {bad + 1}"
        same = bad is not None and skipped is not None and bad < len(skipped) and skipped[bad]
        return f"loss non-finite{at}" + ("; the step skipped its update" if same else "")
    count = sum(w["skipped_steps"] for w in windows)
    if count:
        scale = next((w["loss_scale"] for w in windows if w["skipped_steps"]), None)
        at = f" at loss scale {scale:g}" if scale is not None else ""
        return f"{count} timed step(s) skipped their update (non-finite gradients{at}), the first at step {skip + 1}"
    return None


def merge_ranks(blocks: Sequence[dict]) -> dict:
    """One block from every rank's: rank 0's windows, each rank's skips and finiteness, the first invalid rank's words."""
    first = dict(blocks[0])
    first["windows"] = [
        {**w, "loss_finite": all(b["windows"][i]["loss_finite"] for b in blocks),
         "skipped_steps": max(b["windows"][i]["skipped_steps"] for b in blocks)}
        for i, w in enumerate(blocks[0]["windows"])
    ]  # fmt: skip
    bad = [(r, b["invalid"]) for r, b in enumerate(blocks) if b["invalid"]]
    first["invalid"] = None if not bad else (bad[0][1] if len(blocks) == 1 else f"rank {bad[0][0]}: {bad[0][1]}")
    return first


def invalid_reason(result: dict) -> str | None:
    """Why `result`'s figures come from a model that did not train, or None: its `training` block's words,
    else (a result written before the block) its `loss_finite` field."""
    training = result.get("training")
    if isinstance(training, dict) and training.get("invalid"):
        return str(training["invalid"])
    if result.get("loss_finite") is False:
        return "loss non-finite"
    alternated = result.get("interleaved")  # --interleave: its ratio comes from these runs' windows
    if isinstance(alternated, dict) and alternated.get("invalid"):
        return f"{alternated['invalid']} (in an alternated run)"
    return None


def invalid_words(reason: str) -> str:
    """The verdict's and the table's words for an invalid result."""
    return f"invalid: {reason}"
