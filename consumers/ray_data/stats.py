"""Ray Data's own `stats()`, read into the JSON: each operator's line and figures, and the iterator's.

`DataIterator.stats()` is text meant for a terminal ("Operator 2 MapBatches(...): 8 tasks executed, ...",
then "* Remote wall time: ..." lines); it is kept as Ray words it, one string per figure, under its name.
"""

from __future__ import annotations

import re

_OPERATOR = re.compile(r"^Operator (\d+) (.+?):\s*(.*)$")
_FIGURE = re.compile(r"^\s*\* ([^:]+):\s*(.*)$")
_ITERATOR = "Dataset iterator time breakdown:"


def operators(text: str) -> list[dict]:
    """[{operator, name, summary, figures: {name: words}}] of every operator in `text`, in order."""
    out: list[dict] = []
    current = None
    for line in text.splitlines():
        m = _OPERATOR.match(line)
        if m:
            current = {"operator": int(m[1]), "name": m[2], "summary": m[3].strip(), "figures": {}}
            out.append(current)
            continue
        figure = _FIGURE.match(line)
        if current is not None and figure:
            current["figures"][figure[1].strip()] = figure[2].strip()
        elif line and not line.startswith((" ", "\t", "*")):
            current = None  # a section of its own (the iterator's, the split coordinator's)
    return out


def iterator(text: str) -> dict[str, str] | None:
    """The iterator's time breakdown ({figure: words}, its nested lines included), or None if `text` has none."""
    if _ITERATOR not in text:
        return None
    out: dict[str, str] = {}
    for line in text.split(_ITERATOR, 1)[1].splitlines():
        m = _FIGURE.match(line)
        if m:
            out[m[1].strip()] = m[2].strip()
        elif line and not line.startswith((" ", "\t", "*")):
            break
    return out
