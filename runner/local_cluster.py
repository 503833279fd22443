"""--local-cluster W,P: a whole TensorFlow cluster on this machine, in one command, and nothing left behind.

Starts P parameter servers and W workers as `bench_input.py --job-name ...`
processes on free loopback ports, shows the chief's output, and stops every
task when the chief is done, when any task dies (one line naming it), or on
Ctrl-C / SIGTERM. Each task runs in its own process group and gets SIGTERM if
this process dies (PR_SET_PDEATHSIG); this process is a child subreaper, so
producers orphaned by a killed worker are re-parented here and stopped too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from runner import bind_host, shutdown
from runner.cluster_spec import MODES, ClusterConfig, parse_local_cluster

ROOT = Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_VALUE_FLAGS = {"--local-cluster"}
LOOPBACK = "127.0.0.1"
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt): ")  # a traceback's last line


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the stop below still runs
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)


def _in_child() -> None:
    """Runs in each task before exec: die with the launcher; take signals normally."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    shutdown.unblock_in_child()


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together while picked, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def strip_flags(argv: list[str]) -> list[str]:
    """The user's flags without --local-cluster (its value too), for the tasks' command lines."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in _VALUE_FLAGS:
            skip = True
        elif not any(a.startswith(f + "=") for f in _VALUE_FLAGS):
            out.append(a)
    return out


class Task:
    """One process of the cluster, and the log that says why it stopped."""

    def __init__(self, cc: ClusterConfig, cmd: list[str], show: bool, env: dict[str, str] | None = None) -> None:
        self.cc = cc
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=None if show else self.log,
            stderr=self.log,
            start_new_session=True,
            preexec_fn=_in_child,
        )

    def how(self) -> str:
        """`exited with code 2: <its error line>` / `exited with signal SIGKILL`."""
        rc = self.proc.returncode
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"code {rc}"
        self.log.seek(0)
        lines = [ln.strip() for ln in self.log.read().replace("\r", "\n").splitlines() if ln.strip()]
        # Only the task's own error line, or the last line of a traceback: never TensorFlow's log text.
        why = [ln for ln in lines if ln.startswith("error:")] or [ln for ln in lines if _EXCEPTION.match(ln)]
        last = why[-1] if why else ""
        return f"exited with {how}" + (f": {last}" if last else "")

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


class LocalCluster:
    """The tasks of one local cluster; `stop()` leaves nothing running, whatever state they are in."""

    def __init__(self, argv: list[str], workers: int, ps: int, mode: str) -> None:
        ports = free_ports(workers + ps)
        self.worker_hosts = [f"{LOOPBACK}:{p}" for p in ports[:workers]]
        self.ps_hosts = [f"{LOOPBACK}:{p}" for p in ports[workers:]]
        self.base = [sys.executable, str(ROOT / "bench_input.py"), *strip_flags(argv), "--variable-update", mode]
        self.tasks: list[Task] = []
        self.stopped = False

    def start(self) -> LocalCluster:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        for job, hosts in (("ps", self.ps_hosts), ("worker", self.worker_hosts)):
            for i in range(len(hosts)):
                cc = ClusterConfig(job, i, self.worker_hosts, self.ps_hosts)
                # Its server listens on 127.0.0.1 only, not on every interface (runner/bind_host.py).
                env = bind_host.task_env(cc.host_port, LOOPBACK)
                self.tasks.append(Task(cc, [*self.base, *cc.flags()], show=cc.is_chief, env=env))
        return self

    def wait(self) -> str | None:
        """Until the chief is done (None), or a task fails (the line naming it)."""
        chief = next(t for t in self.tasks if t.cc.is_chief)
        while True:
            if self.stopped:  # Ctrl-C / SIGTERM: runner.shutdown is stopping the tasks and then exits
                time.sleep(0.1)
                continue
            # A task that exits 0 has been released by the chief (parameter servers included).
            if any(t.proc.poll() not in (None, 0) for t in self.tasks):
                first = self._first_failure()
                return f"error: {first.cc.name} {first.how()}"
            if chief.proc.poll() == 0:
                return None
            time.sleep(0.1)

    def _first_failure(self) -> Task:
        """The task whose failure started it: one killed by a signal, else a worker before the chief.

        The others fail within moments of it (their step barrier breaks), so look
        again after a short while before naming one.
        """
        time.sleep(0.5)
        failed = [t for t in self.tasks if t.proc.poll() not in (None, 0)]
        killed = [t for t in failed if t.proc.returncode < 0]
        return (killed or [t for t in failed if not t.cc.is_chief] or failed)[0]

    def finish(self, timeout: float = 60.0) -> str | None:
        """After the chief: the others exit on their own once released; a line for any that fails."""
        deadline = time.monotonic() + timeout
        for t in self.tasks:
            try:
                rc = t.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return f"error: {t.cc.name} did not exit {timeout:g} s after the chief finished"
            if rc != 0:
                return f"error: {t.cc.name} {t.how()}"
        return None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every task's group (they stop their producers), then SIGKILL what is left, orphans included."""
        if self.stopped:
            return
        self.stopped = True
        for t in self.tasks:
            if t.proc.poll() is None:
                t.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for t in self.tasks:
            try:
                t.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                t.signal(signal.SIGKILL)
                t.proc.wait()
            t.signal(signal.SIGKILL)  # anything still in the task's group
        # Producers of a killed worker were re-parented to us (subreaper): stop them as well.
        for _ in range(3):
            left = psutil.Process().children(recursive=True)
            if not left:
                break
            for p in left:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.terminate()
            _, alive = psutil.wait_procs(left, timeout=5)
            for p in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        for t in self.tasks:
            t.log.close()


def run_local_cluster(argv: list[str], spec: str, mode: str) -> int:
    """Run the cluster for `bench_input.py argv` and return the exit code; the chief prints the report.

    Ctrl-C and SIGTERM reach runner.shutdown's watcher, which stops the cluster through the registered `stop`.
    """
    workers, ps = parse_local_cluster(spec)
    mode = mode if mode in MODES else MODES[0]
    cluster = LocalCluster(argv, workers, ps, mode)
    print(
        f"local cluster: {workers} worker(s) on {','.join(cluster.worker_hosts)}, "
        f"{ps} parameter server(s) on {','.join(cluster.ps_hosts)}, {mode}",
        flush=True,
    )
    shutdown.register(cluster.stop)
    try:
        cluster.start()
        line = cluster.wait()
        if line is None:
            line = cluster.finish()
    finally:
        shutdown.unregister(cluster.stop)
        cluster.stop()
    if line:
        print(line, file=sys.stderr, flush=True)
    return 2 if line else 0
