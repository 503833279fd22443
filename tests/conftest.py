"""Shared fixtures: short ipc endpoints, and producer processes that never outlive a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

# As bench_input.py has it (tf_trainer/tf_env.py), whichever test module imports TensorFlow first:
# TensorFlow reads its log level once, at import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ipc_dir() -> Iterator[str]:
    """A short folder for ipc:// sockets (their paths are limited to about 100 bytes)."""
    with tempfile.TemporaryDirectory(prefix="fb-", dir="/tmp") as d:
        yield d


class Procs:
    """Starts project processes in their own session and kills the whole group at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, *args: str, **kw) -> subprocess.Popen:
        kw.setdefault("cwd", ROOT)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("text", True)
        p = subprocess.Popen([sys.executable, *args], start_new_session=True, **kw)
        self.started.append(p)
        return p

    def producer(self, endpoint: str, *extra: str) -> subprocess.Popen:
        return self.start("-m", "producers", "synthetic", "--endpoint", endpoint, "--quiet", *extra)

    def cleanup(self) -> None:
        for p in self.started:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    try:
        yield ps
    finally:
        ps.cleanup()


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
