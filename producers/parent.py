"""A producer started by a run dies with the run, however the run ends.

The run starts each producer in its own session (so stopping one stops its
workers), which also means nothing ties the producer to the run when the run
is killed with SIGKILL or crashes. So the run names itself in the
environment, and the producer asks the kernel for SIGTERM when its parent
dies (PR_SET_PDEATHSIG), then checks that the parent is still the one named,
which closes the window between fork and the request. A producer whose
parent is gone stops its workers, exits, and removes the run's socket files
and folder (only sockets, and the folder only once it is empty), which the
dead run can no longer remove itself.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat

PARENT_ENV = "FEEDBENCH_PARENT_PID"
RUN_DIR_ENV = "FEEDBENCH_RUN_DIR"
TMPDIR_ENV = "FEEDBENCH_PRODUCERS_TMPDIR"  # the producers' private TMPDIR (runner/producer_group.py)
_PR_SET_PDEATHSIG = 1

_expected: int | None = None
_run_dir: str | None = None
_tmpdir: str | None = None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for `sig` when the parent (the thread that started us) exits."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except OSError:  # not Linux: the parent's cleanup still stops us
        pass


def watch() -> None:
    """Call first thing in a producer process; does nothing unless a run started it.

    The variables are taken out of the environment so that workers (which
    watch the producer instead) and anything they start do not inherit them.
    """
    global _expected, _run_dir, _tmpdir
    pid = os.environ.pop(PARENT_ENV, None)
    _run_dir = os.environ.pop(RUN_DIR_ENV, None)
    _tmpdir = os.environ.pop(TMPDIR_ENV, None)
    if not pid or not pid.isdigit():
        return
    _expected = int(pid)
    die_with_parent(signal.SIGTERM)
    # Until the launcher takes over SIGTERM, a dead parent ends us here, tidily.
    signal.signal(signal.SIGTERM, _exit_if_orphaned)
    if gone():
        _exit_if_orphaned(signal.SIGTERM, None)


def gone() -> bool:
    """True when the run that started this producer has died."""
    return _expected is not None and os.getppid() != _expected


def clean_run_dir(own: list[str] = ()) -> None:
    """Remove the dead run's socket files, this producer's `own` files, then the folder if empty; nothing else.

    Every producer does this; whichever removes the last of its files also removes the folder.
    (A run's shm:// endpoint leaves nothing to remove: its sockets are abstract and its regions anonymous.)
    The producers' private TMPDIR goes too, whatever is in it: the dead run would have removed it.
    """
    if not gone():
        return
    if _tmpdir:
        shutil.rmtree(_tmpdir, ignore_errors=True)
    if not _run_dir:
        return
    for path in own:
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        names = os.listdir(_run_dir)
    except OSError:
        return
    for name in names:
        path = os.path.join(_run_dir, name)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except OSError:
            pass
    try:
        os.rmdir(_run_dir)
    except OSError:  # not empty, or another producer was quicker
        pass


def _exit_if_orphaned(signum: int, _frame) -> None:
    clean_run_dir()
    os._exit(128 + signum)
