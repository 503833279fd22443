"""The processes a user's loader starts: found and stopped when the loader is done, and named where it left them.

A loader's callable may start processes of its own (a cache server, a decoding pool), besides the ones its
iteration starts (a DataLoader's or a DataFlow's workers). feedbench makes every loader in a process of its
own, never in the run's: there, each process the loader starts is found below it, even one whose parent
exited (the loader's process adopts orphans, PR_SET_CHILD_SUBREAPER), and when the loader is done every one
still running is stopped. Those the callable itself started are named (`note_built` records them as the
callable returns): a training loop that makes the loader leaves them running too.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import signal
import sys
import threading

import psutil

_PR_SET_CHILD_SUBREAPER = 36
_by_callable: dict[int, tuple[float, str]] = {}  # pid -> (its start time, its words): started by the callable
_left: list[str] = []  # the words of those found still running when the loader was done


def adopt_orphans() -> None:
    """Make this process the one an orphaned descendant is re-parented to, so that it can still be found."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def descendants() -> list[psutil.Process]:
    """This process's children and theirs, still running."""
    try:
        return [p for p in psutil.Process().children(recursive=True) if _running(p)]
    except psutil.Error:
        return []


def snapshot() -> set[int]:
    """The pids below this process now (before the loader's callable is called)."""
    return {p.pid for p in descendants()}


def note_built(before: set[int]) -> None:
    """Record the processes that appeared below this process since `before`: the callable started them."""
    ours = {p.pid: p for p in mp.active_children()}
    for p in descendants():
        if p.pid not in before and p.pid not in _by_callable:
            with contextlib.suppress(psutil.Error):
                _by_callable[p.pid] = (p.create_time(), _words(p, ours.get(p.pid)))


def note_stopping(pids: list[int]) -> None:
    """Called just before `pids` are stopped: those the callable started are ones the loader left running."""
    for pid in pids:
        known = _by_callable.pop(pid, None)
        if known is not None and _same(pid, known[0]):
            _left.append(known[1])


def stop_all(grace: float = 2.0) -> list[str]:
    """Stop every process still below this one (SIGTERM, then SIGKILL after `grace` s); the words of the ones the
    loader's callable started and left running, found here or by an earlier `note_stopping`."""
    if threading.current_thread() is threading.main_thread():  # a DataLoader's SIGCHLD handler raises at its
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # workers' ends (core/loader_spec.py stop_children)
    procs = descendants()
    note_stopping([p.pid for p in procs])
    _stop(procs, grace)
    left = list(_left)
    _left.clear()
    return left


def stop_started(grace: float = 2.0) -> list[str]:
    """Stop only what the loader's callable started (and what those started), in a process that also runs
    other things and so cannot stop everything below it: a trainer, whose `loader` path made the loader in its
    own process. The words of those still running, as `stop_all` gives them."""
    procs: list[psutil.Process] = []
    for pid, (started, _) in list(_by_callable.items()):
        if not _same(pid, started):
            _by_callable.pop(pid)
            continue
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(pid)
            procs += [top, *top.children(recursive=True)]
    note_stopping([p.pid for p in procs])
    _stop(procs, grace)
    left = list(_left)
    _left.clear()
    return left


def _stop(procs: list[psutil.Process], grace: float) -> None:
    """SIGTERM to each of `procs`, SIGKILL to those still running after `grace` s."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)


_said: set[str] = set()  # the loaders already named this run


def say_left(name: str, left: list[str]) -> None:
    """One line for the processes a loader's callable started and left running (stopped since), once per run
    and loader: each copy of the loader (a sweep's points, --tune's settings) runs the same callable, and one
    copy's processes may be seen before a shell among them has exec'd its command, another's after."""
    if not left or name in _said:
        return
    _said.add(name)
    words = "; ".join(left)
    if words:
        print(
            f"note: loader {name}: its callable started processes that were still running when the loader was "
            f"done: {words}; feedbench stopped them (a training loop that makes this loader leaves them running)",
            file=sys.stderr,
            flush=True,
        )


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _same(pid: int, started: float) -> bool:
    """True while `pid` is still the process that started at `started` (not a reused pid)."""
    try:
        return psutil.Process(pid).create_time() == started
    except psutil.Error:
        return False


def _words(p: psutil.Process, proc: mp.process.BaseProcess | None) -> str:
    """A process as a user recognises it: a multiprocessing Process by its name (a copy of this process has this
    process's command line), anything else by its command line."""
    if proc is not None:
        return f"pid {p.pid} (multiprocessing.Process {proc.name!r})"
    try:
        cmd = " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        cmd = "?"
    return f"pid {p.pid} ({cmd[:120]})"
