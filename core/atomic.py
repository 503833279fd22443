"""One way to write a result file: to a temporary file beside it, then rename, so no reader sees half of it."""

from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, data: bytes | str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".feedbench-", dir=folder)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
