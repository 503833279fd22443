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

import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import ConfigError, InputError
from producers import commands
from producers.parent import PARENT_ENV, RUN_DIR_ENV, TMPDIR_ENV
from runner import shutdown
from runner.folder_reaper import private_tmpdir_folder
from wire.endpoints import IPC_PATH_MAX

ROOT = Path(__file__).resolve().parent.parent


class RunDir:
    """The run's private folder for its ipc sockets, made only when producers are about to start.

    Its name is chosen up front (the zmq op needs the endpoint while the
    graph is built) and the folder made later, 0700, failing if the name was
    taken meanwhile. Under TMPDIR, or /tmp when TMPDIR is too long for the
    socket `longest` in it (sun_path holds 107 bytes).
    """

    def __init__(self, longest: str = "python-dataset", transport: str = "ipc") -> None:
        self.transport = transport
        base = tempfile.gettempdir()
        if len(os.fsencode(base)) + len("/feedbench-00000000/") + len(os.fsencode(longest)) > IPC_PATH_MAX:
            base = "/tmp"
        self.name = os.path.join(base, f"feedbench-{secrets.token_hex(4)}")
        self.made = False

    def endpoint(self, name: str) -> str:
        if self.transport == "shm":  # slots in shared memory; their sockets are abstract (no file: wire/shm.py)
            return f"shm://{os.path.basename(self.name)}-{name}"
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


class ProducerDied(InputError):
    """A producer exited while the run still needed it."""


class ProducerGroup:
    """N producer processes pushing to one endpoint that the run's consumer binds.

    `on_exit="stop"`: the first producer to exit fails the run; "continue":
    only the last one does. `run_dir` is the run's folder (sockets, stats
    files), which the producers remove if the run dies without doing so.
    """

    members = "producers"  # what the group's processes are called in a run's warnings

    def __init__(
        self,
        commands: list[list[str]],
        endpoint: str,
        stats_files: list[str | None] | None = None,
        on_exit: str = "stop",
        run_dir: str | None = None,
    ) -> None:
        self.commands = commands
        self.endpoint = endpoint
        self.stats_files = stats_files or [None] * len(commands)
        self.on_exit = on_exit
        self.run_dir = run_dir
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []
        self.failure: str | None = None  # set by the watcher: the line that says which producer exited and how
        self._interrupts: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self.tmpdir: str | None = None  # the producers' TMPDIR, removed once they are stopped

    def start(self) -> ProducerGroup:
        # The producers die with this process (PR_SET_PDEATHSIG is tied to the thread that starts them:
        # start them from the run's main thread).
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        if self.run_dir:
            env[RUN_DIR_ENV] = self.run_dir
        # Their TMPDIR, removed once they are stopped (by the run, or by the producers where the run died first,
        # producers/parent.py): what their loaders leave there goes with it, such as the pymp-* folders of
        # DataLoader workers ended by a signal, which skip multiprocessing's clean-up.
        self.tmpdir = private_tmpdir_folder()
        env["TMPDIR"] = env[TMPDIR_ENV] = self.tmpdir
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
            if exited and (self.on_exit == "stop" or self.none_left(exited)):
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

    def none_left(self, exited: dict[int, str]) -> bool:
        """Whether the processes that have exited (`exited()`) leave the run nothing to read from."""
        return len(exited) == len(self.procs)

    def exited(self) -> dict[int, str]:
        """Producers that have exited, each with a line saying how (the run's line names the endpoint)."""
        return {i: self._how(i, p.returncode) for i, p in enumerate(self.procs) if p.poll() is not None}

    def _how(self, i: int, code: int) -> str:
        said = self.stderr(i)
        if code < 0:
            # Killed: whatever it printed last (a progress line, a warning) is not why it stopped.
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            last_error = said if said.startswith("error") else ""
            return f"producer {i} exited, killed by {name}" + (f": {last_error}" if last_error else "")
        return f"producer {i} exited with code {code}: {said or 'no output'}"

    def check(self) -> None:
        """Raise ProducerDied, with the producer's last words, if the group has failed."""
        if self.failure is not None:
            raise ProducerDied(self.failure)
        exited = self.exited()
        if exited and (self.on_exit == "stop" or self.none_left(exited)):
            raise ProducerDied(exited[min(exited)])

    def stderr(self, i: int) -> str:
        """Producer i's last error line (or its last line): what it said about why it stopped."""
        text = self.log_text(i)
        lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error")]
        return (errors or lines or [""])[-1]

    def log_text(self, i: int) -> str:
        """Everything producer i has written to stderr so far."""
        # pread leaves the shared file offset alone: the producer keeps appending where it was.
        fd = self._logs[i].fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

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
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self) -> ProducerGroup:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ProducerWatch:
    """--on-producer-exit between two steps, the same in either trainer (a TensorFlow callback calls `check`
    after each step, a PyTorch rank before each). "stop": fail naming the dead producer; "continue": say so
    once per producer and go on with the others, failing only when none is left."""

    def __init__(self, group: ProducerGroup, on_exit: str, who: str = "") -> None:
        self.group = group
        self.on_exit = on_exit
        self.who = who  # "rank 1: " in a PyTorch run, whose ranks each watch their own share
        self.reported: set[int] = set()

    def check(self) -> None:
        if self.on_exit == "stop":
            self.group.check()
            return
        exited = self.group.exited()
        for i, message in exited.items():
            if i not in self.reported:
                self.reported.add(i)
                print(f"  warning: {self.who}{message}; continuing with the other {self.group.members}", flush=True)
        if self.group.none_left(exited):
            self.group.check()


def run_producer_command(
    cfg: Any, endpoint: str, producer_id: int, stats_file: str, device_id: int | None = None
) -> list[str]:
    """The command line of one of a run's producers, from the run's flags (both trainers start them so).

    `device_id`: the GPU the producer's batches go to, where a dali producer decodes with --dali-device gpu.
    """
    return commands.producer_argv(
        cfg.producer_kind,
        endpoint,
        producer_id,
        cfg.batch,
        cfg.image_size,
        cfg.wire_format,
        cfg.producer_workers,
        cfg.hwm,
        data=cfg.data,
        curve_keys=cfg.curve_keys,
        rate=cfg.producer_rate,
        stats_file=stats_file,
        dali_threads=cfg.dali_threads,
        dali_device=cfg.dali_device,
        cpu_ms_per_batch=cfg.producer_cpu_ms,
        busy_wait=cfg.producer_busy_wait,
        device_id=device_id,
        loader=getattr(cfg, "loader", None),
        loader_args=getattr(cfg, "loader_arg", ()) or (),
        loader_timeout=getattr(cfg, "loader_timeout", None),
    )


def start_producers(
    cfg: Any,
    endpoints: str | list[str],
    folder: str | None,
    ids: list[int] | None = None,
    device_ids: list[int | None] | None = None,
    supervise: bool = True,
) -> ProducerGroup | None:
    """Start a run's producers, producer k pushing to endpoints[k % len(endpoints)]; None with --endpoint.

    The one place either trainer starts producers (the run binds, producers connect),
    or says it waits for the user's. `ids`: which producers (default: all of the run's,
    1000 x i; a PyTorch rank starts its share); their stats files go in `folder`.
    `device_ids`: the GPU each one's batches go to, where dali producers decode on the GPU
    (default: spread over the towers' GPUs, not all on GPU 0). `supervise`: the group applies
    --on-producer-exit and removes `folder` if the run dies first (a PyTorch rank watches its own).
    """
    endpoints = [endpoints] if isinstance(endpoints, str) else endpoints
    if cfg.endpoint:  # the run waits for the user's producer; a PyTorch rank, for those that address it
        who = "an external producer" if ids is None else "external producers"
        print(f"  waiting for {who} to connect to {', '.join(endpoints)}", flush=True)
        return None
    ids = [1000 * i for i in range(cfg.producers)] if ids is None else ids
    gpus = max(1, cfg.num_gpus or 1)
    device_ids = [k % gpus for k in range(len(ids))] if device_ids is None else device_ids
    stats = [os.path.join(folder, f"producer-{pid}.json") for pid in ids]  # each producer's own figures
    cmds = [
        run_producer_command(cfg, endpoints[k % len(endpoints)], pid, stats[k], device_ids[k])
        for k, pid in enumerate(ids)
    ]
    if not supervise:
        return ProducerGroup(cmds, ", ".join(endpoints), stats).start()
    return ProducerGroup(cmds, ", ".join(endpoints), stats, cfg.on_producer_exit, run_dir=folder).start()


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def check_producer_flags(cfg: Any) -> None:
    """Refuse producer flags that cannot work (ConfigError), before anything starts."""
    if cfg.curve_keys:
        from wire.curve import CurveError, check_folder

        try:
            check_folder(cfg.curve_keys)
        except CurveError as e:
            raise ConfigError(str(e)) from None
    if cfg.producer_kind == "loader" or getattr(cfg, "loader", None):
        _check_loader(cfg)
    elif cfg.producer_kind != "synthetic":
        if not cfg.data:
            raise ConfigError(
                f"--producer-kind {cfg.producer_kind} needs --data DIR (make one: python -m producers make-dataset DIR)"
            )
        if not os.path.isdir(cfg.data):
            raise ConfigError(f"--data {cfg.data}: no such folder")
        if cfg.producer_kind == "dali" and not _importable("nvidia.dali"):
            raise ConfigError("--producer-kind dali: NVIDIA DALI is not installed (pip install -e '.[dali]')")


def _check_loader(cfg: Any) -> None:
    """--loader: its spelling, its file and its arguments, without importing it here (ConfigError)."""
    from core.loader_spec import LoaderError, LoaderSpec

    if not cfg.loader:
        raise ConfigError("--producer-kind loader needs --loader MODULE:CALLABLE")
    try:
        spec = LoaderSpec.parse(cfg.loader, cfg.loader_arg)
    except LoaderError as e:
        raise ConfigError(str(e)) from None
    module = spec.target.rpartition(":")[0]
    if (module.endswith(".py") or os.sep in module) and not os.path.isfile(module):
        raise ConfigError(f"--loader {spec.target}: no such file {module}")
    if cfg.endpoint:
        raise ConfigError(
            f"--loader and --endpoint: the run starts the loader's producers itself; for an external one, run "
            f"python -m producers loader --loader {spec.target} --endpoint {cfg.endpoint} there, without --loader here"
        )
