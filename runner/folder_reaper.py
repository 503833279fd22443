"""A folder removed when the run exits, however it exits: SIGKILL of its whole process group included.

A run's private TMPDIR (runner/loader_only.py `private_tmpdir`) is removed by
the run at its end or on a signal, and by its loader processes where the run
alone was killed. Where every one of them was killed at once (`kill -9` of the
group, the OOM killer) nobody is left to remove it: a small watcher in a
session of its own holds the read end of a pipe whose write end only the run
holds, and removes the folder once that pipe reads end-of-file.
"""

from __future__ import annotations

import subprocess
import sys

GRACE_S = 3.0  # after the run's end, time for its loader processes to stop theirs and remove the folder first

_WATCH = """
import os, shutil, sys, time
folder, grace = sys.argv[1], float(sys.argv[2])
while sys.stdin.buffer.read(65536):
    pass
deadline = time.monotonic() + grace
while os.path.exists(folder) and time.monotonic() < deadline:
    time.sleep(0.05)
shutil.rmtree(folder, ignore_errors=True)
"""


class FolderReaper:
    """Watches `folder` from outside the run's process group; `close` ends the watch once the run removed it."""

    def __init__(self, folder: str) -> None:
        self.watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCH, folder, str(GRACE_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives a SIGKILL of the run's group
        )

    def close(self) -> None:
        """The run is done with the folder (and removed it): the watcher exits at once."""
        if self.watcher.stdin is not None:
            self.watcher.stdin.close()
        try:
            self.watcher.wait(timeout=GRACE_S + 2)
        except subprocess.TimeoutExpired:
            self.watcher.kill()
            self.watcher.wait()
