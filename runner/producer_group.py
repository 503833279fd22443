"""The producer processes a run starts for itself, and the guarantee that it stops them.

Each producer runs in its own process group, so stopping it also stops its
workers; `stop()` is idempotent and called from `finally` blocks and signal
handlers alike, so no producer outlives the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from producers import commands
from runner import shutdown

ROOT = Path(__file__).resolve().parent.parent


class ProducerDied(RuntimeError):
    """A producer exited while the run still needed it."""


class ProducerGroup:
    """N producer processes pushing to one endpoint that the run's consumer binds."""

    def __init__(self, commands: list[list[str]], endpoint: str) -> None:
        self.commands = commands
        self.endpoint = endpoint
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []

    def start(self) -> ProducerGroup:
        for cmd in self.commands:
            log = tempfile.TemporaryFile(mode="w+")
            self._logs.append(log)
            p = subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                preexec_fn=shutdown.unblock_in_child,  # the run blocks SIGTERM/SIGINT in its own threads
            )
            self.procs.append(p)
        shutdown.register(self.stop)
        return self

    def exited(self) -> dict[int, str]:
        """Producers that have exited, each with a line saying how."""
        return {
            i: f"producer {i} for {self.endpoint} exited with code {p.returncode}: {self.stderr(i) or 'no output'}"
            for i, p in enumerate(self.procs)
            if p.poll() is not None
        }

    def check(self) -> None:
        """Raise ProducerDied, with the producer's last words, if any producer has exited."""
        for message in self.exited().values():
            raise ProducerDied(message)

    def stderr(self, i: int) -> str:
        log = self._logs[i]
        log.seek(0)
        lines = [ln.strip() for ln in log.read().replace("\r", "\n").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error")]
        return (errors or lines or [""])[-1]

    def log_text(self, i: int) -> str:
        """Everything producer i has written to stderr so far (its progress lines, if not --quiet)."""
        # pread leaves the shared file offset alone: the producer keeps appending where it was.
        fd = self._logs[i].fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stop(self, timeout: float = 10.0) -> None:
        shutdown.unregister(self.stop)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for log in self._logs:
            log.close()
        self._logs = []
        self.procs = []

    def __enter__(self) -> ProducerGroup:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def producer_command(
    kind: str,
    endpoint: str,
    producer_id: int,
    batch: int,
    image_size: int,
    fmt: str,
    workers: int,
    hwm: int,
    data: str | None = None,
    curve_keys: str | None = None,
    rate: float | None = None,
    quiet: bool = True,
    cpu_ms_per_batch: float | None = None,
    busy_wait: bool = False,
) -> list[str]:
    """The command line of one producer (synthetic, decode or dali) that connects to the run's endpoint.

    `rate` caps each worker's images/s; `quiet=False` keeps the producer's progress
    line (its own counters), which the profiler reads from the log on zmq-consume.
    """
    extra = ["--hwm", str(hwm), "--producer-id", str(producer_id)]
    if rate:
        extra += ["--rate", f"{rate:g}"]
    if curve_keys:
        extra += ["--curve-keys", curve_keys]
    if busy_wait:
        extra += ["--busy-wait"]
    if cpu_ms_per_batch and kind == "synthetic":
        extra += ["--cpu-ms-per-batch", f"{cpu_ms_per_batch:g}"]
    return commands.producer_command(
        kind, endpoint, batch, image_size, data=data, workers=workers, fmt=fmt, quiet=quiet, extra=extra
    )
