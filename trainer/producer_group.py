"""The producer processes a run starts for itself, and the guarantee that it stops them.

Each producer runs in its own process group, so stopping it also stops its
workers; `stop()` is idempotent and called from `finally` blocks and signal
handlers alike, so no producer outlives the run. A run that is killed outright
cannot call it: the producers watch for their parent's death themselves
(`producers.parent`) and remove the run's socket folder.

A watcher thread notices a producer that exits within a tenth of a second and
calls the run's interrupt hooks (which cancel a training step blocked on
input), so a producer that fails at start is reported with its own last line
at once, not after --recv-timeout.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from producers import commands
from producers.parent import PARENT_ENV, RUN_DIR_ENV
from trainer import shutdown
from wire.endpoints import IPC_PATH_MAX

ROOT = Path(__file__).resolve().parent.parent


# The longest socket name a run uses inside its folder ("python-dataset"), with room to spare.
_LONGEST_NAME = 32


class RunDir:
    """The run's private folder for its ipc sockets, made only when producers are about to start.

    Its name is chosen up front (the zmq op needs the endpoint while the
    graph is built) and the folder made later, 0700, failing if the name was
    taken meanwhile. Under TMPDIR, or /tmp when TMPDIR is too long for a
    socket path (sun_path holds 107 bytes).
    """

    def __init__(self) -> None:
        base = tempfile.gettempdir()
        if len(os.fsencode(base)) + len("/feedbench-00000000/") + _LONGEST_NAME > IPC_PATH_MAX:
            base = "/tmp"
        self.name = os.path.join(base, f"feedbench-{secrets.token_hex(4)}")
        self.made = False

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.name}/{name}"

    def make(self) -> None:
        if not self.made:
            os.mkdir(self.name, 0o700)
            self.made = True
            shutdown.register(self.remove)

    def remove(self) -> None:
        shutdown.unregister(self.remove)
        if self.made:
            import shutil

            shutil.rmtree(self.name, ignore_errors=True)
            self.made = False


class ProducerDied(RuntimeError):
    """A producer exited while the run still needed it."""


class ProducerGroup:
    """N producer processes pushing to one endpoint that the run's consumer binds.

    `on_exit="stop"`: the first producer to exit fails the run; "continue":
    only the last one does. `run_dir` is the run's socket folder, which the
    producers remove if the run dies without doing so.
    """

    def __init__(
        self, commands: list[list[str]], endpoint: str, on_exit: str = "stop", run_dir: str | None = None
    ) -> None:
        self.commands = commands
        self.endpoint = endpoint
        self.on_exit = on_exit
        self.run_dir = run_dir
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []
        self.failure: str | None = None  # set by the watcher: the line that says which producer exited and how
        self._interrupts: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> ProducerGroup:
        # The producers die with this process (PR_SET_PDEATHSIG is tied to the thread that starts them:
        # start them from the run's main thread).
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        if self.run_dir:
            env[RUN_DIR_ENV] = self.run_dir
        shutdown.register(self.stop)
        for cmd in self.commands:
            log = tempfile.TemporaryFile(mode="w+")
            self._logs.append(log)
            p = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                preexec_fn=shutdown.unblock_in_child,  # the run blocks SIGTERM/SIGINT in its own threads
            )
            self.procs.append(p)
        self._watcher = threading.Thread(target=self._watch, name="feedbench-producers", daemon=True)
        self._watcher.start()
        return self

    def on_failure(self, fn: Callable[[], None]) -> None:
        """Call `fn` (from the watcher thread) when the group fails; at once if it already has."""
        with self._lock:
            if self.failure is None:
                self._interrupts.append(fn)
                return
        fn()

    def remove_on_failure(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._interrupts:
                self._interrupts.remove(fn)

    def _watch(self) -> None:
        while not self._stopping.wait(0.1):
            exited = self.exited()
            if exited and (self.on_exit == "stop" or len(exited) == len(self.procs)):
                with self._lock:
                    if self._stopping.is_set():
                        return
                    self.failure = exited[min(exited)]
                    todo, self._interrupts = self._interrupts, []
                for fn in todo:
                    try:
                        fn()
                    except Exception:  # an interrupt that fails leaves the run's own check to report it
                        pass
                return

    def exited(self) -> dict[int, str]:
        """Producers that have exited, each with a line saying how."""
        return {i: self._how(i, p.returncode) for i, p in enumerate(self.procs) if p.poll() is not None}

    def _how(self, i: int, code: int) -> str:
        said = self.stderr(i)
        if code < 0:
            # Killed: whatever it printed last (a progress line, a warning) is not why it stopped.
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            last_error = said if said.startswith("error") else ""
            return f"producer {i} for {self.endpoint} was killed by {name}" + (f": {last_error}" if last_error else "")
        return f"producer {i} for {self.endpoint} exited with code {code}: {said or 'no output'}"

    def check(self) -> None:
        """Raise ProducerDied, with the producer's last words, if the group has failed."""
        if self.failure is not None:
            raise ProducerDied(self.failure)
        exited = self.exited()
        if exited and (self.on_exit == "stop" or len(exited) == len(self.procs)):
            raise ProducerDied(exited[min(exited)])

    def stderr(self, i: int) -> str:
        """Producer i's last error line (or its last line): what it said about why it stopped."""
        text = self.log_text(i)
        lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error")]
        return (errors or lines or [""])[-1]

    def log_text(self, i: int) -> str:
        """Everything producer i has written to stderr so far (its progress lines, if not --quiet)."""
        # pread leaves the shared file offset alone: the producer keeps appending where it was.
        fd = self._logs[i].fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to each producer's group, SIGKILL only to those still there after `timeout`."""
        with self._lock:
            self._stopping.set()
            self._interrupts = []
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
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
    return commands.producer_command(
        kind, endpoint, batch, image_size, data=data, workers=workers, fmt=fmt, quiet=quiet, extra=extra
    )
