"""An `--out` folder's earlier results are kept, never overwritten silently.

Before a run writes its files into a folder that already holds a set from an
earlier run (`make bench` wrote `results/`, a later command is given `--out
results`), that set is linked into `<folder>/earlier/<when it was made, UTC>/`
and the run says where. Hard links cost no disk space and leave the earlier
files whole when the new ones replace them; a failed write removes the copy
again, so the folder is as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence

from core.atomic import NotReadable, read_regular
from core.errors import OutputError

EARLIER = "earlier"


# An earlier results.json larger than this is not read for its time (its files' time is taken instead).
READ_AT_MOST = 64 * 2**20


def _made_at(out_dir: str, names: Sequence[str]) -> float:
    """When the earlier set was made: its JSON's `started` where that is a time up to now, else its oldest file's
    modification time. A file that does not read as a result (not JSON, nested too deep, a `started` of 1e300 or
    NaN) is still kept: only its time is taken from the file system."""
    for name in names:
        if name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError, RecursionError, NotReadable, AttributeError):
                started = json.loads(read_regular(os.path.join(out_dir, name), READ_AT_MOST)).get("started")
                if isinstance(started, int | float) and 0 <= started <= time.time() + 86400:
                    return float(started)
    return min(os.path.getmtime(os.path.join(out_dir, n)) for n in names)


def _stamp(seconds: float) -> str:
    """The earlier set's folder name: its UTC time, or the epoch where the time cannot be one (a clock far off)."""
    try:
        return time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime(seconds))
    except (OverflowError, ValueError, OSError):
        return time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime(0))


def keep_earlier(out_dir: str, names: Iterable[str]) -> str | None:
    """Link the files of `names` already in `out_dir` into out_dir/earlier/<time>/; that folder, or None."""
    old = [n for n in names if os.path.isfile(os.path.join(out_dir, n))]
    if not old:
        return None
    stamp = _stamp(_made_at(out_dir, old))
    dest, n = os.path.join(out_dir, EARLIER, stamp), 1
    while os.path.exists(dest):
        n += 1
        dest = os.path.join(out_dir, EARLIER, f"{stamp}-{n}")
    try:
        os.makedirs(dest)
        for name in old:
            try:
                os.link(os.path.join(out_dir, name), os.path.join(dest, name))
            except OSError:  # a file system without hard links
                shutil.copy2(os.path.join(out_dir, name), os.path.join(dest, name))
    except OSError as e:
        _drop(dest)
        raise OutputError(f"--out {out_dir}: cannot keep the earlier results in {dest}: {e.strerror or e}") from None
    return dest


def _drop(dest: str) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(dest))  # only if no other earlier set is there


def write_keeping_earlier(out_dir: str, names: Sequence[str], write: Callable[[], list[str]]) -> list[str]:
    """`write()` the files `names` into `out_dir`, after keeping an earlier set of them; the paths written, and
    the folder the earlier set went to (said, so nothing is replaced silently)."""
    kept = keep_earlier(out_dir, names)
    try:
        written = write()
    except BaseException:
        if kept:
            _drop(kept)
        raise
    return [*written, f"{kept}{os.sep} (the earlier results that were in {out_dir}, kept)"] if kept else written
