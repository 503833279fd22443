"""`ray-data`: a Ray Data pipeline makes the batches on a Ray cluster (the run's own on 127.0.0.1, or
--ray-address's), split across the ranks with `streaming_split`; each rank iterates its split
(docs/engines.md)."""

from __future__ import annotations

import importlib.util
from typing import Any

from core.errors import ConfigError
from core.registry import Declaration, needs_own_work
from core.result_fields import RankValues, ResultField

NAME = "ray-data"


def validate(cfg: Any) -> None:
    """The producers' synthetic or decode work (or a --loader, checked when the pipeline is built:
    consumers/ray_data/loader_rows.py), and --ray-address reachable when given."""
    if cfg.producer_kind != "loader":
        needs_own_work(cfg, NAME, "its pipeline does", loader="map-style dataset")
    if cfg.ray_address:
        from consumers.ray_data.cluster import check_address

        check_address(cfg.ray_address, cfg.recv_timeout)


def installed(cfg: Any) -> None:
    """Ray Data, checked without importing it."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.data") is None:
        raise ConfigError(f"--fake-location {NAME}: Ray Data is not installed (pip install 'ray[data]')")


def merge_ranges(ranges: list[list[int]]) -> list[list[int]]:
    """Half-open [start, end) ranges, sorted and joined where they touch or overlap."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def merge_images(name: str, values: RankValues) -> dict[str, Any]:
    """Every image's sequence number, over the ranks: how many arrived, how many distinct, how many twice."""
    received = sum(v["received"] for _, v in values)
    distinct = sum(b - a for a, b in merge_ranges([r for _, v in values for r in v["ranges"]]))
    per_rank = [{"rank": r, "received": v["received"], "distinct": v["distinct"]} for r, v in values]
    return {name: {"received": received, "distinct": distinct, "duplicated": received - distinct, "ranks": per_rank}}


def merge_ray(name: str, values: RankValues) -> dict[str, Any]:
    """The cluster as rank 0 saw it (the one that built the pipeline), and each rank's own iterator."""
    first = dict(next(v for r, v in values if r == min(r for r, _ in values)))
    ranks = [{"rank": r, **{k: v.get(k) for k in RANK_KEYS}} for r, v in values]
    return {name: {**{k: v for k, v in first.items() if k not in RANK_KEYS}, "ranks": ranks}}


RANK_KEYS = ("images_per_sec", "iterator_stats")  # what each rank's iterator measured itself

IMAGES = ResultField(
    "images",
    {
        "type": "object",
        "description": "ray-data: every image's sequence number through the pipeline, over the ranks: received "
        "by the steps (with what the iterators had prefetched), distinct, and duplicated (came more than once)",
        "required": ["received", "distinct", "duplicated", "ranks"],
        "properties": {
            "received": {"type": "integer", "minimum": 0},
            "distinct": {"type": "integer", "minimum": 0},
            "duplicated": {"type": "integer", "minimum": 0},
            "ranks": {"type": "array", "items": {"type": "object", "required": ["rank", "received", "distinct"]}},
        },
    },
    merge_images,
)

_OPERATOR = {
    "type": "object",
    "required": ["operator", "name", "summary", "figures"],
    "properties": {
        "operator": {"type": "integer"},
        "name": {"type": "string"},
        "summary": {"type": "string"},
        "figures": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
RAY = ResultField(
    "ray",
    {
        "type": "object",
        "description": "ray-data: the Ray cluster (its GCS address, whether the run started it and with how many "
        "CPUs), how the ranks iterated (iter_batches on a prefetch thread, each batch pinned and copied by "
        "feeders/device_copy.py), the Ray processes' CPU cores over the timed steps (the head's servers, each "
        "worker) and whether more would help, the workers that died mid-run, and Ray Data's own stats() per "
        "operator; per rank, the images/s its split delivered and its iterator's time breakdown",
        "required": ["address", "started_here", "iterator", "ranks"],
        "properties": {
            "address": {"type": "string"},
            "started_here": {"type": "boolean"},
            "cpus": {"type": ["integer", "null"]},
            "iterator": {"type": "string"},
            "prefetch_batches": {"type": "integer"},
            "block_batches": {"type": "integer", "description": "--ray-block-batches: batches per block (Ray task)"},
            "pin_memory": {"type": "boolean"},
            "head_cpu_cores": {"$ref": "#/$defs/number_or_null"},
            "workers": {"type": "array", "items": {"type": "object", "required": ["worker", "cpu_cores"]}},
            "more_workers": {"type": ["string", "null"]},
            "workers_died": {
                "type": ["array", "null"],
                "description": "the workers of rank 0's Ray job that died unasked during the run (Ray retried "
                "their tasks), from the GCS's worker table; null where it could not be read",
                "items": {"type": "object", "required": ["pid", "ip", "exit_type", "detail"]},
            },
            "operators": {"type": "array", "items": _OPERATOR},
            "ranks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["rank", "images_per_sec"],
                    "properties": {
                        "rank": {"type": "integer", "minimum": 0},
                        "images_per_sec": {"$ref": "#/$defs/number_or_null"},
                        "iterator_stats": {"type": ["object", "null"]},
                    },
                },
            },
        },
    },
    merge_ray,
)

PATH = Declaration(
    name=NAME,
    summary="Ray Data: a pipeline on a Ray cluster (the run's own, --ray-cpus CPUs) makes the batches; each rank "
    "iterates its streaming split",
    order=85,
    in_default_run=False,
    frameworks=("torch",),
    advice="the Ray Data iterator in the trainer limits (batching and formatting per step): more prefetch_batches, "
    "or feed from producers (zmq-consume)",
    input_advice="give Ray more CPUs (--ray-cpus), or other hosts' (--ray-address HOST:PORT)",
    floor_words="Ray's workers limit: raise --ray-cpus",
    delivers_words="the Ray Data pipeline delivers",
    validate=validate,
    checks={"torch": installed},
    fields=(IMAGES, RAY),
)
