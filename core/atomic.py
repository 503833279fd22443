"""The one way to write result files: to temporary files beside them, then rename, so no reader sees half of one.

`write_all` writes a set of files (a run's results.json, .csv, .md, .png) so
that either every one of them is there or none is: each is written to a
temporary name in its folder first, and only when all are complete are they
renamed into place. A full disk (ENOSPC), a file-size limit (EFBIG) or any
other write error removes the temporary files and raises OutputError (one
line, exit code 2). An existing target that is not a regular file (a symlink,
a device, a pipe) is never replaced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile

from core.errors import OutputError


def not_regular(path: str) -> str | None:
    """What `path` is when it exists and is not a regular file ("a symlink", "a device", ...); else None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


class NotReadable(Exception):
    """`read_regular` refused a file: it is no regular file (`str(e)` says what it is), or it is too large."""


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of `path` when it is (or links to) a regular file of at most `limit` bytes; NotReadable else.

    A FIFO is opened without waiting for a writer and a device is never read, so a result file named by a user
    can neither hang the reader nor fill its memory. OSError when it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotReadable(_kind(mode))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotReadable(f"over {limit / 2**20:g} MiB")
    return data


def write_all(files: dict[str, bytes | str], what: str | None = None) -> list[str]:
    """Write every `{path: data}`, all or none; returns the paths. OutputError (naming `what`, e.g. `--out DIR`)."""
    label = f"{what}: " if what else ""
    temps: list[tuple[str, str]] = []
    path = ""
    try:
        for path, data in files.items():
            kind = not_regular(path)
            if kind:
                raise OutputError(f"{label}{path} exists and is {kind}; refusing to replace it; nothing written")
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".feedbench-", dir=folder)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
        for tmp, path in temps:
            os.replace(tmp, path)
        temps.clear()
    except OSError as e:
        why = e.strerror or str(e)
        code = f" ({errno.errorcode.get(e.errno, e.errno)})" if e.errno else ""
        raise OutputError(f"{label}cannot write {path}: {why}{code}; nothing written") from None
    finally:
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return list(files)


def atomic_write(path: str, data: bytes | str, what: str | None = None) -> None:
    """One file, written whole or not at all (OutputError)."""
    write_all({path: data}, what)
