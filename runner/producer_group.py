"""The producer processes a run starts for itself, and the guarantee that it stops them.

Each producer runs in its own process group, so stopping it also stops its
workers; `stop()` is idempotent and called from `finally` blocks and signal
handlers alike, so no producer outlives the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from core.errors import ConfigError, InputError
from producers import commands
from runner import shutdown

ROOT = Path(__file__).resolve().parent.parent


class ProducerDied(InputError):
    """A producer exited while the run still needed it."""


class ProducerGroup:
    """N producer processes pushing to one endpoint that the run's consumer binds."""

    def __init__(self, commands: list[list[str]], endpoint: str, stats_files: list[str | None] | None = None) -> None:
        self.commands = commands
        self.endpoint = endpoint
        self.stats_files = stats_files or [None] * len(commands)
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

    def stats(self) -> list[dict | None]:
        """Each producer's latest figures from its --stats-file (None where none was written yet)."""
        out = []
        for path in self.stats_files:
            try:
                with open(path) as f:
                    out.append(json.load(f))
            except (TypeError, OSError, ValueError):
                out.append(None)
        return out

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
    stats_file: str | None = None,
    dali_threads: int = 1,
) -> list[str]:
    """The command line of one producer (synthetic, decode or dali) that connects to the run's endpoint.

    `rate` caps each worker's images/s; `stats_file` is where the producer writes
    its own figures once a second (read where the consumer sees no native headers).
    """
    extra = ["--hwm", str(hwm), "--producer-id", str(producer_id)]
    if rate:
        extra += ["--rate", f"{rate:g}"]
    if curve_keys:
        extra += ["--curve-keys", curve_keys]
    if stats_file:
        extra += ["--stats-file", stats_file]
    if kind == "dali":
        extra += ["--dali-threads", str(dali_threads)]
    return commands.producer_command(
        kind, endpoint, batch, image_size, data=data, workers=workers, fmt=fmt, quiet=True, extra=extra
    )


def start_producers(cfg: Any, endpoint: str, folder: str) -> ProducerGroup:
    """Start the run's `cfg.producers` producers of `cfg.producer_kind`; their stats files go in `folder`."""
    stats = [os.path.join(folder, f"producer-{i}.json") for i in range(cfg.producers)]
    cmds = [
        producer_command(
            cfg.producer_kind,
            endpoint,
            1000 * i,
            cfg.batch,
            cfg.image_size,
            cfg.wire_format,
            cfg.producer_workers,
            cfg.hwm,
            data=cfg.data,
            curve_keys=cfg.curve_keys,
            rate=cfg.producer_rate,
            stats_file=stats[i],
            dali_threads=cfg.dali_threads,
        )
        for i in range(cfg.producers)
    ]
    return ProducerGroup(cmds, endpoint, stats).start()


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def check_producer_flags(cfg: Any) -> None:
    """Refuse producer flags that cannot work (ConfigError), before anything starts."""
    if cfg.producer_kind != "synthetic":
        if not cfg.data:
            raise ConfigError(
                f"--producer-kind {cfg.producer_kind} needs --data DIR (make one: python -m producers make-dataset DIR)"
            )
        if not os.path.isdir(cfg.data):
            raise ConfigError(f"--data {cfg.data}: no such folder")
        if cfg.producer_kind == "dali" and not _importable("nvidia.dali"):
            raise ConfigError("--producer-kind dali: NVIDIA DALI is not installed (pip install -e '.[dali]')")
