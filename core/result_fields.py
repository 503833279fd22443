"""A field an input path adds to its result: what it may hold, and how a PyTorch run's ranks merge it.

A path declares its own fields (`Declaration.fields`, in `consumers/<path>/path.py`), next to where
it makes them (`result_fields()` of its halves). The PyTorch trainer merges each rank's value by the
field's `merge` and knows no field by name; the results schema takes each field's `schema` as the
path result's property (`consumers.declared.results_schema`), so a field nobody declared is still
refused there. A merge takes [(rank, value)] of the ranks that made the field and returns the
fields of the merged result (usually just `{name: merged}`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

RankValues = list[tuple[int, Any]]
Merge = Callable[[str, RankValues], dict[str, Any]]


@dataclass(frozen=True)
class ResultField:
    """One field of a path's result: its JSON schema (the merged value's), and how ranks merge it."""

    name: str
    schema: Mapping[str, Any]
    merge: Merge
    # Fields the merge writes beside `name` (e.g. a per-rank list), with their schemas.
    also: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def properties(self) -> dict[str, Any]:
        """The result properties this field brings to the schema: its own and those its merge adds."""
        return {self.name: dict(self.schema), **{k: dict(v) for k, v in self.also.items()}}


def summed(name: str, values: RankValues) -> dict[str, Any]:
    """A count over the run: each rank's added up."""
    return {name: sum(v for _, v in values)}


def summed_with_ranks(name: str, values: RankValues) -> dict[str, Any]:
    """A count over the run, and each rank's own beside it (`<name>_per_rank`)."""
    return {name: sum(v for _, v in values), f"{name}_per_rank": [v for _, v in values]}


def all_true(name: str, values: RankValues) -> dict[str, Any]:
    """A property of the run: true only where every rank's was."""
    return {name: all(bool(v) for _, v in values)}


def summed_each(name: str, values: RankValues) -> dict[str, Any]:
    """Counts by key ({key: number}): each key added up over the ranks."""
    keys = dict.fromkeys(k for _, v in values for k in v)
    return {name: {k: sum(v.get(k, 0) for _, v in values) for k in keys}}


def per_rank(key: str) -> Merge:
    """A rank's own value, kept per rank: [{"rank": r, key: value}]."""

    def merge(name: str, values: RankValues) -> dict[str, Any]:
        return {name: [{"rank": r, key: v} for r, v in values]}

    return merge


def rank_rows(name: str, values: RankValues) -> dict[str, Any]:
    """A rank's own row ({...}), kept per rank with its rank: [{"rank": r, ...}]."""
    return {name: [{"rank": r, **v} for r, v in values]}


def every_row(name: str, values: RankValues) -> dict[str, Any]:
    """Rows each rank made ([{...}]), one list of them all, each with its rank."""
    return {name: [{"rank": r, **row} for r, v in values for row in v]}


def refuse_undeclared(fields: Mapping[str, ResultField], made: Any, path: str) -> None:
    """ValueError naming each field in `made` that `fields` (the path's declaration) does not declare."""
    unknown = [k for k in made if k not in fields]
    if unknown:
        raise ValueError(f"{path}: result field(s) {', '.join(unknown)} not declared in its Declaration(fields=...)")


def merge_path_fields(fields: Mapping[str, ResultField], ranks: list[dict], path: str) -> dict[str, Any]:
    """The merged result's fields, from every rank's `path_fields`, by each declared field's own merge.

    A field no rank made is left out; a rank without it takes no part in its merge. A rank's field
    that `fields` does not declare raises ValueError: it would otherwise be dropped without a word.
    """
    out: dict[str, Any] = {}
    made = dict.fromkeys(k for r in ranks for k in r.get("path_fields", {}))
    refuse_undeclared(fields, made, path)
    for name in made:
        values = [(r["rank"], r["path_fields"][name]) for r in ranks if name in r.get("path_fields", {})]
        out.update(fields[name].merge(name, values))
    return out
