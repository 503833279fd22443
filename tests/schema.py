"""Check a report against docs/results.schema.json, naming the first field that does not match."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "results.schema.json").read_text())
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def check_report(doc: dict) -> None:
    """AssertionError naming the field (as a JSON path) and the problem, for every mismatch found."""
    errors = sorted(_VALIDATOR.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{e.json_path}: {e.message[:300]}" for e in errors[:10]]
        raise AssertionError("report does not match docs/results.schema.json:\n" + "\n".join(lines))


def check_part(part: dict, name: str) -> None:
    """Check one block of a document against the schema's `$defs/<name>` (a --loader-only document's block)."""
    schema = {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{name}"}
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(part), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{e.json_path}: {e.message[:300]}" for e in errors[:10]]
        raise AssertionError(f"block does not match docs/results.schema.json $defs/{name}:\n" + "\n".join(lines))
