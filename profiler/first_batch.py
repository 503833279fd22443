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
  rank waits for it;
- end, TensorFlow: the first training step has ended. The graph takes its
  batch inside that step, so the figure includes making the session and that
  one step's compute (the table's step time says how long a step takes).
"""

from __future__ import annotations

START = "the path's input opening (model built; no producer, loader or receiver started yet)"
END = {
    "tf": "the end of the first training step (session made, first batch taken and trained on once)",
    "torch": "the first batch in the training loop's hands (next() returned; the slowest rank's)",
}


def figure(framework: str, seconds: float, per_rank: list[float] | None = None) -> dict:
    """The `first_batch` block of a path's result (docs/results.md)."""
    out: dict = {"seconds": seconds, "from": START, "to": END[framework]}
    if per_rank is not None:
        out["per_rank_s"] = per_rank
    return out


def line(results: dict[str, dict]) -> str | None:
    """One line under the table: each path's time to its first batch, and between which events."""
    got = {p: r["first_batch"] for p, r in results.items() if r.get("first_batch")}
    if not got:
        return None
    first = next(iter(got.values()))
    times = ", ".join(f"{p} {fb['seconds']:.2f} s" for p, fb in got.items())
    return f"first batch: {times} (from {first['from']} to {first['to']})"
