"""How the processes that make a user's loader start: copied from this process where that is safe.

Every `--loader-only` point, `--tune` setting, `--epochs` run and loader producer worker makes the loader
in a process of its own, after this process has imported the loader's file to check it. Spawned, each of
those imports torch and torchvision again: 2-3 CPU-seconds each, more than a short measurement's own work
on a small machine, and not what the user's training loop pays. Forked, they start with the file's imports
already made; each still calls the loader's callable itself, so nothing of the loader is shared.

Forking is safe only while this process holds no thread that a copy would lose mid-way: no Python thread
(such as the timeline's sampler; the signal watcher, which only waits, is none), no thread a library started
after the loader's file was imported (TensorFlow's runtime once it runs an op or opens a session, OpenCV's
pool once it resizes), no framework that keeps threads or a device from its import on (JAX, DALI) and no
CUDA context; otherwise the workers are spawned. Importing TensorFlow, OpenCV or numpy starts only BLAS
pools, idle until used, which copy safely (their libraries stop and restart them around a fork): a
tf.data or DataFlow loader's copies skip TensorFlow's import, about 3 CPU-seconds each.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
from multiprocessing.context import BaseContext

# Modules that hold threads or device state from their import on: a copy of a process that loaded them may
# hang in the child (XLA's and DALI's thread pools).
UNSAFE_TO_COPY = ("jax", "nvidia.dali")
# Modules safe to copy only once their imports' idle pools are all they started (note_imported): without
# that count, a process that loaded them spawns its workers.
SAFE_WHILE_IDLE = ("tensorflow", "cv2")
# runner/shutdown.py's signal watcher: it waits in sigwait() and holds no lock a copy could inherit held.
SIGNAL_WATCHER = "feedbench-shutdown"
_imported_threads: int | None = None  # library threads when the loader's file was imported (note_imported)


def library_threads() -> int:
    """This process's threads that Python did not start (a library's pools), from /proc; -1 where unknown."""
    try:
        return len(os.listdir("/proc/self/task")) - threading.active_count()
    except OSError:
        return -1


def note_imported() -> None:
    """Once the loader's file is imported: the threads its imports started are idle pools a copy may lose;
    any thread started after it (a framework's runtime) makes copies unsafe. The first import counts."""
    global _imported_threads
    if _imported_threads is None:
        _imported_threads = library_threads()


def _tensorflow_running() -> bool:
    """True once TensorFlow's eager runtime is up in this process (its context made, with thread pools)."""
    context = sys.modules.get("tensorflow.python.eager.context")
    ctx = context.context_safe() if context is not None else None
    return ctx is not None and getattr(ctx, "_context_handle", None) is not None


def start_method() -> str:
    """'fork' where a copy of this process can make the loader safely; 'spawn' otherwise (module docstring)."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and t.name != SIGNAL_WATCHER]
    if "fork" not in mp.get_all_start_methods() or others:
        return "spawn"
    if any(name in sys.modules for name in UNSAFE_TO_COPY):
        return "spawn"
    if any(name in sys.modules for name in SAFE_WHILE_IDLE):
        now = library_threads()
        if _imported_threads is None or now < 0 or now > _imported_threads or _tensorflow_running():
            return "spawn"
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        return "spawn"  # a CUDA context cannot be used in a forked child
    return "fork"


def context() -> BaseContext:
    """The multiprocessing context for the loader's processes, chosen now (start_method)."""
    return mp.get_context(start_method())


def in_child() -> None:
    """In a worker, once its signal handlers are set: what a copied one must redo that a spawned one gets.

    The temporary folder is found again from TMPDIR: the parent cached its own (tempfile's and
    multiprocessing's) before it set TMPDIR to the run's private folder, and the loader's files and its
    DataLoader's pymp-* folders belong in that. SIGINT and SIGTERM are unblocked: the run's process blocks
    them in every thread but its watcher (runner/shutdown.py), and a copy inherits the mask.
    """
    tempfile.tempdir = None
    mp.current_process()._config.pop("tempdir", None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
