"""The errors a run reports as one line, `error: <what>: <why>`, with exit code 2.

Every failure a user can cause (a flag, an endpoint, a producer, a batch that
does not match) is raised as one of these with a message that names the
thing at fault; `bench_input.py` prints it and stops everything it started.
"""

from __future__ import annotations


class FeedbenchError(RuntimeError):
    """A failure with a message fit to show the user as it is (one line, names the cause)."""

    exit_code = 2


class ConfigError(FeedbenchError, ValueError):
    """A flag or a combination of flags that cannot work; raised before anything starts."""


class InputError(FeedbenchError):
    """An input path could not deliver what the run needed; the message says which path and why."""


class OutputError(FeedbenchError):
    """A result file could not be written (a full disk, a target that is not a regular file); nothing was."""
