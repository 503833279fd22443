"""`tf-data-service`: a dispatcher and workers of TensorFlow's tf.data service make the batches in their own
processes (here, or on other hosts with --dispatcher); the trainer reads them over gRPC (docs/engines.md)."""

from __future__ import annotations

import socket
from typing import Any

from consumers.fields import PRODUCERS
from core.errors import ConfigError
from core.registry import Declaration, needs_own_work
from core.result_fields import ResultField, per_rank

NAME = "tf-data-service"
MODES = ("off", "dynamic")  # tf.data.experimental.service.ShardingPolicy.OFF / DYNAMIC


def dispatcher_address(text: str) -> tuple[str, int]:
    """`grpc://HOST:PORT` (or `HOST:PORT`) -> (host, port); ConfigError naming the flag otherwise."""
    rest = text.removeprefix("grpc://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--dispatcher {text}: expected grpc://HOST:PORT")
    return host.strip("[]"), int(port)


def check_reachable(text: str, timeout: float) -> None:
    """ConfigError naming the address when no dispatcher listens there (within `timeout` seconds)."""
    host, port = dispatcher_address(text)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e)).lower()
        raise ConfigError(
            f"--dispatcher {text}: no tf.data service dispatcher reachable there ({why} within {timeout:g} s)"
        ) from None


def validate(cfg: Any) -> None:
    if cfg.producer_kind != "loader":  # a --loader's pipeline is checked when it is made (consumers/tf_loader.py)
        needs_own_work(cfg, NAME, "its workers run", loader="tf.data pipeline")
    if cfg.service_mode not in MODES:
        raise ConfigError(f"--service-mode {cfg.service_mode}: choose from {', '.join(MODES)}")
    if cfg.dispatcher:
        check_reachable(cfg.dispatcher, cfg.recv_timeout)


# Where the service is and what its processes used (TensorFlow only: no ranks to merge).
SERVICE = ResultField(
    "service",
    {
        "type": "object",
        "description": "tf-data-service: the tf.data service's dispatcher (grpc://HOST:PORT), its processing mode (off, dynamic), whether the run started it; for its own: the dispatcher's (head_cpu_cores) and each worker's CPU cores over the timed steps and whether more workers would help (more_workers); with dynamic sharding, what was delivered overall (delivered: received, distinct, duplicated, missing); with --loader and dynamic sharding, what cannot be checked (not_checked); with --on-producer-exit continue, the service processes that exited (exited, one line each) and the passes that ended with them (streams_ended: their numbers in producers)",
        "required": ["dispatcher", "mode", "started_here"],
        "properties": {
            "dispatcher": {"type": "string"},
            "mode": {"enum": ["off", "dynamic"]},
            "started_here": {"type": "boolean"},
            "head_cpu_cores": {"$ref": "#/$defs/number_or_null"},
            "workers": {"type": "array", "items": {"type": "object", "required": ["worker", "address", "cpu_cores"]}},
            "more_workers": {"type": ["string", "null"]},
            "not_checked": {"type": "string"},
            "exited": {"type": "array", "items": {"type": "string"}},
            "streams_ended": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "delivered": {
                "type": "object",
                "required": ["received", "distinct", "duplicated", "missing"],
                "properties": {
                    "received": {"type": "integer", "minimum": 0},
                    "distinct": {"type": "integer", "minimum": 0},
                    "duplicated": {"type": "integer", "minimum": 0},
                    "missing": {"type": "integer", "minimum": 0},
                },
            },
        },
    },
    per_rank("service"),
)

PATH = Declaration(
    name=NAME,
    summary="tf.data service: a dispatcher and --service-workers worker processes make the batches, read over gRPC",
    order=80,
    in_default_run=False,
    frameworks=("tf",),
    advice=(
        "the tf.data service's client limits (gRPC receive and unpacking in the trainer): fewer, larger batches, "
        "or the native op (zmq-consume)"
    ),
    input_advice=(
        "add tf.data service workers (--service-workers), on other hosts once this one's cores are spent "
        "(--dispatcher grpc://HOST:PORT)"
    ),
    floor_words="the service's workers limit: add --service-workers",
    delivers_words="the tf.data service workers deliver",
    validate=validate,
    fields=(PRODUCERS, SERVICE),
)
