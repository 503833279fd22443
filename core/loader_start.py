"""How the processes that make a user's loader start: copied from this process where that is safe.

Every `--loader-only` point, `--tune` setting, `--epochs` run and loader producer worker makes the loader
in a process of its own, after this process has imported the loader's file to check it. Spawned, each of
those imports torch and torchvision again: 2-3 CPU-seconds each, more than a short measurement's own work
on a small machine, and not what the user's training loop pays. Forked, they start with the file's imports
already made; each still calls the loader's callable itself, so nothing of the loader is shared.

Forking is safe only while this process holds no thread that a copy would lose mid-way (a Python thread
such as the timeline's sampler; the signal watcher, which only waits, is none), no framework that keeps
threads or a device once loaded (TensorFlow, JAX, DALI, OpenCV's pool) and no CUDA context; otherwise the
workers are spawned, as before.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import tempfile
import threading
from multiprocessing.context import BaseContext

# Modules that start threads or hold device state on import or first use: a copy of a process that loaded
# them may hang in the child (TensorFlow's runtime, XLA's, DALI's and OpenCV's thread pools).
UNSAFE_TO_COPY = ("tensorflow", "jax", "nvidia.dali", "cv2")
# runner/shutdown.py's signal watcher: it waits in sigwait() and holds no lock a copy could inherit held.
SIGNAL_WATCHER = "feedbench-shutdown"


def start_method() -> str:
    """'fork' where a copy of this process can make the loader safely; 'spawn' otherwise (module docstring)."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and t.name != SIGNAL_WATCHER]
    if "fork" not in mp.get_all_start_methods() or others:
        return "spawn"
    if any(name in sys.modules for name in UNSAFE_TO_COPY):
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
