"""The one error type for anything wrong with a message taken off the wire."""

from __future__ import annotations


class WireError(ValueError):
    """A message that cannot be decoded; `field` names the part that is wrong.

    Receivers catch this one type, so a hostile or broken peer costs one
    rejected message, never a crash deep inside numpy.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
