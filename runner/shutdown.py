"""Ctrl-C and SIGTERM stop the run at once, whatever it is blocked in.

A Python signal handler only runs when the main thread returns to Python,
and a training step blocked inside TensorFlow may not return for a long
time. So the signals are blocked in every thread and taken by one watcher
thread instead, which runs the registered clean-ups (stop producers, remove
sockets) and exits. Results are written atomically at the very end, so an
interrupted run leaves no partial file.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from core.loader_start import SIGNAL_WATCHER

SIGNALS = {signal.SIGINT, signal.SIGTERM}
_cleanups: list[Callable[[], None]] = []
_lock = threading.Lock()
_installed = False
_announce = True
_stopping = threading.Event()


def register(fn: Callable[[], None]) -> None:
    with _lock:
        _cleanups.append(fn)


def unregister(fn: Callable[[], None]) -> None:
    with _lock:
        if fn in _cleanups:
            _cleanups.remove(fn)


def run_cleanups() -> None:
    with _lock:
        todo = list(reversed(_cleanups))
        _cleanups.clear()
    for fn in todo:
        try:
            fn()
        except Exception as e:  # keep going: every producer must be stopped
            print(f"warning: clean-up failed: {e}", file=sys.stderr)


def stopping() -> bool:
    """True once a signal is being handled: the process is about to exit, whatever else happens."""
    return _stopping.is_set()


def wait_for_exit(limit_s: float = 60.0) -> None:
    """Block while the signal watcher stops the run and exits (it ends the process itself)."""
    threading.Event().wait(limit_s)


def _watch() -> None:
    sig = signal.sigwait(SIGNALS)
    _stopping.set()
    if _announce:
        print(
            f"\ninterrupted ({signal.Signals(sig).name}): stopping producers; no results written",
            file=sys.stderr,
            flush=True,
        )
    run_cleanups()
    os._exit(128 + sig)  # 130 for SIGINT, 143 for SIGTERM, as a shell reports them


def install(announce: bool = True) -> None:
    """Call from the main thread first thing, before any import that starts threads (TensorFlow, matplotlib).

    Threads inherit the blocked mask, so only the watcher takes the signals. A
    signal the run was started with ignored (SIGINT under `nohup` or `cmd &`)
    is taken too: an ignored signal would be dropped even while blocked.
    `announce=False` stops without a line: a process whose parent speaks for
    the run (a PyTorch rank, stopped by its launcher).
    """
    global _installed, _announce
    _announce = announce
    if _installed:
        return
    _installed = True
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    threading.Thread(target=_watch, name=SIGNAL_WATCHER, daemon=True).start()


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, and block the signals again in this thread.

    Starting it (which the first spawned process or shared array does)
    unblocks SIGINT and SIGTERM in the calling thread, so the default action
    would kill the process instead of the watcher taking the signal.
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    if _installed:
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def unblock_in_child() -> None:
    """Child processes inherit the blocked mask; producers take signals the normal way."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
