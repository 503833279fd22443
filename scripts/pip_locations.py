"""Package locations in pip's configuration that do not exist on this machine, left out of set-up's pip runs.

A pip configuration (a pip.conf, PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL) may name
folders on this machine's disk as extra places to find packages: a
`find-links` folder, a `file://` index. Where such a folder does not exist,
pip warns "Location '...' is ignored" for every package it looks up, over a
hundred lines in one set-up, about nothing the set-up or its user can act
on. scripts/setup_env.sh runs this once, before its first pip command:
where a location is missing, it prints the shell lines that give pip the
same settings less the missing locations (see `exports`), and says once,
on stderr, which it left out. A location that exists, a remote index, and
every other setting and warning of pip are left as they are (settings of a
pip.conf section for another pip command than install are not carried).

    eval "$(.venv/bin/python scripts/pip_locations.py)"
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from urllib.parse import unquote, urlparse

KEYS = ("find-links", "extra-index-url")
SECTIONS = ("global", "install", ":env:")  # what `pip install` reads (":env:": PIP_* variables)


def configured(listing: str) -> dict[str, str]:
    """{key: value} of the settings `pip install` reads, from `pip config list`'s lines
    (`section.key='value'`); a later line overrides an earlier one, as pip lists its files and then its
    environment in the order it reads them."""
    out: dict[str, str] = {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in SECTIONS and key != "config-file":
            out[key] = " ".join(shlex.split(value))
    return out


def local_path(location: str) -> str | None:
    """The folder a location names on this machine's disk, or None for a remote one."""
    url = urlparse(location)
    if url.scheme == "file":
        return unquote(url.path)
    if not url.scheme or len(url.scheme) == 1:  # a plain path (or a Windows drive letter)
        return location
    return None


def missing(value: str) -> tuple[list[str], list[str]]:
    """(kept, left out): the locations of `value`, split on whitespace as pip does, by whether they exist."""
    kept, gone = [], []
    for location in value.split():
        path = local_path(location)
        (gone if path is not None and not os.path.exists(path) else kept).append(location)
    return kept, gone


def exports(settings: dict[str, str]) -> tuple[list[str], list[str]]:
    """(shell lines, what was left out): nothing when every location exists.

    Otherwise pip reads no configuration file (PIP_CONFIG_FILE=/dev/null, as pip documents) and every
    setting it read from one is given as its PIP_* variable instead, the locations less the missing ones.
    An empty variable would not override a file, hence no file at all.
    """
    left_out = {k: missing(settings[k]) for k in KEYS if k in settings}
    gone = [g for _, g in left_out.values() for g in g]
    if not gone:
        return [], []
    lines = ["export PIP_CONFIG_FILE=/dev/null"]
    for key, value in settings.items():
        var = "PIP_" + key.upper().replace("-", "_")
        if key in left_out:
            value = " ".join(left_out[key][0])
        lines.append(f"export {var}={shlex.quote(value)}" if value else f"unset {var}")
    return lines, gone


def main() -> int:
    try:
        listing = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0  # no configuration to read: pip runs as configured
    lines, gone = exports(configured(listing))
    if gone:
        print("\n".join(lines))
        print(f"setup: pip's configuration names {', '.join(gone)}, which this machine does not have: left out of "
              "this set-up's pip runs", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
