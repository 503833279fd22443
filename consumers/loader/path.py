"""`loader`: the user's `--loader` run inside the trainer, no producers (docs/loader.md)."""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError
from core.registry import Declaration

_ADVICE = {
    "tf": (
        "your loader limits inside the trainer: raise its parallelism (num_parallel_calls, DataLoader "
        "num_workers), speed up its slowest stage (--loader-only names it), or run it as producers on other "
        "cores (--fake-location zmq-consume)"
    ),
    "torch": (
        "your loader limits inside the rank: raise its workers (DataLoader num_workers), speed up its slowest "
        "stage (--loader-only names it), or run it as producers on other cores (--fake-location zmq-consume)"
    ),
}


def validate(cfg: Any) -> None:
    if not cfg.loader:
        raise ConfigError("--fake-location loader needs --loader MODULE:CALLABLE")


PATH = Declaration(
    name="loader",
    summary={
        "tf": "your --loader in the trainer: a tf.data pipeline inside the graph, else from_generator",
        "torch": "your --loader inside each rank (a DataLoader with pin_memory), no producers",
    },
    order=70,
    in_default_run=False,
    advice=_ADVICE,
    input_advice=_ADVICE,
    floor_words={"tf": "your loader limits: raise its parallelism", "torch": "your loader limits: raise its workers"},
    delivers_words="the loader delivers",
    validate=validate,
)
