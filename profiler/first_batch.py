"""Time to the first batch: how long a path took from its input's start to its first batch in the trainer's hands.

What a user waits for before training starts ("613 s to the first batch"),
told apart from the steady rate the table reports. Both trainers record two
clock readings and hand them here, so the figure, its JSON field and its line
in the report mean the same for TensorFlow and PyTorch:

- start: just before the path's input opens (`open`): the model and, on
  TensorFlow, the graph are already built; no producer, loader or receiver of
  the path has started yet;
- end, PyTorch: the training loop holds the rank's first batch (`next()` has
  returned it); the path's figure is the slowest rank's, since a step of every
  rank waits for it. The model's start-up is not in it;
- end, TensorFlow: the first training step has ended. The graph takes its
  batch inside that step, so the figure includes making the session and that
  one step, whose first run optimises the graph and allocates its memory: the
  model's start-up. Its two parts are kept (`parts`): up to the first step's
  start (the input started, the session made) and the first step. The baseline (`gpu`) has no
  input to wait for, so its figure is the model's start-up alone, and a path's
  time beyond it is roughly its input's.
"""

from __future__ import annotations

from core.registry import BASELINE

START = "the path's input opening (model built; no producer, loader or receiver started yet)"
END = {
    "tf": "the end of the first training step (session made, first batch taken and trained on once)",
    "torch": "the first batch in the training loop's hands (next() returned; the slowest rank's)",
}
SPANS = {
    "tf": "the model's start-up (the session, the first step's graph optimisation and memory) and the input's "
    "first batch",
    "torch": "the input's first batch only (the model was built and placed before)",
}


def figure(
    framework: str, seconds: float, per_rank: list[float] | None = None, parts: dict[str, float] | None = None
) -> dict:
    """The `first_batch` block of a path's result (docs/results.md)."""
    out: dict = {"seconds": seconds, "from": START, "to": END[framework], "spans": SPANS[framework]}
    if per_rank is not None:
        out["per_rank_s"] = per_rank
    if parts is not None:
        out["parts"] = parts
    return out


def _path_words(path: str, fb: dict) -> str:
    """One path's figure, its parts, and for the baseline what it is made of."""
    parts = fb.get("parts")
    words = f"{path} {fb['seconds']:.2f} s"
    if parts:
        before = "the session made" if path == BASELINE else "the input started and the session made"
        words += (
            f" ({parts['to_first_step_s']:.2f} s to its first step, {before}; first step {parts['first_step_s']:.2f} s"
        )
        words += ": the model's start-up alone, no input to wait for)" if path == BASELINE else ")"
    elif path == BASELINE:
        words += " (its batch is made on the device: no input to wait for)"
    return words


def line(results: dict[str, dict]) -> str | None:
    """Under the table: each path's time to its first batch, between which events, and what it spans."""
    got = {p: r["first_batch"] for p, r in results.items() if r.get("first_batch")}
    if not got:
        return None
    first = next(iter(got.values()))
    times = ", ".join(_path_words(p, fb) for p, fb in got.items())
    spans = first.get("spans")
    head = f"first batch, from {first['from']} to {first['to']}"
    return f"{head}: {times}" + (f"; each figure spans {spans}" if spans else "")
