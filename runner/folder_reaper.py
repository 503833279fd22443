"""A run's private TMPDIR: short enough for the sockets made in it, and removed when the run exits, however it
exits: SIGKILL of its whole process group included.

A run's private TMPDIR (runner/loader_only.py `private_tmpdir`) is removed by
the run at its end or on a signal, and by its loader processes where the run
alone was killed. Where every one of them was killed at once (`kill -9` of the
group, the OOM killer) nobody is left to remove it: a small watcher in a
session of its own holds the read end of a pipe whose write end only the run
holds, and removes the folder once that pipe reads end-of-file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from wire.endpoints import IPC_PATH_MAX

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


# The deepest socket a loader's multiprocessing makes in its TMPDIR (a worker handing over a descriptor).
MP_SOCKET = "/pymp-00000000/listener-00000000"


def private_tmpdir_folder() -> str:
    """A new folder (fb-*) for processes' TMPDIR, under the run's TMPDIR, or /tmp where that is too long for
    multiprocessing's sockets inside it (sun_path holds 107 bytes)."""
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) + len("/fb-00000000") + len(MP_SOCKET) > IPC_PATH_MAX:
        base = "/tmp"
    return tempfile.mkdtemp(prefix="fb-", dir=base)


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
