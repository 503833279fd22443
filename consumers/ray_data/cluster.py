"""The Ray cluster a `ray-data` run reads from: its own on 127.0.0.1, or an existing one it joins.

A run's own cluster is one head node started by `ray.init` in rank 0's
process, in a temp folder of its own (removed at the end), without a
dashboard, and with every server on 127.0.0.1: Ray resolves a loopback node
address to the host's routable one unless it is told this host is not part
of a larger cluster (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read when `ray`
is imported). Its authentication token is made here and handed to the other
ranks with the address, so nothing is written to ~/.ray. Ray starts its
servers with kernel fate-sharing (they die with the process that started
them); `stop` still kills whatever is left of them by process id, and a
signal's clean-up does only that (no `ray.shutdown`, which could block).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from typing import Any

import psutil

from core.errors import ConfigError, InputError

LOOPBACK = "127.0.0.1"
# Ray's sockets live at <temp>/session_<date>_<time>_<pid>/sockets/plasma_store: AF_UNIX allows 107 bytes.
SOCKET_TAIL = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
SOCKET_LIMIT = 107


def local_environment(token: str | None) -> None:
    """Set, before `ray` is imported, what keeps this process's Ray on loopback and its token off disk."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # a loopback node address stays 127.0.0.1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if token is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token


def _quiet_init(**kwargs: Any) -> Any:
    """`ray.init` without its log lines on the run's terminal (they stay in the session's logs)."""
    import logging

    import ray

    logging.getLogger("ray").setLevel(logging.ERROR)
    return ray.init(log_to_driver=False, configure_logging=False, logging_level=logging.ERROR, **kwargs)


def check_address(text: str, timeout: float) -> None:
    """ConfigError naming `--ray-address` when nothing listens there within `timeout` seconds."""
    host, _, port = text.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {text}: expected HOST:PORT (a Ray head's GCS address)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e)).lower()
        raise ConfigError(f"--ray-address {text}: no Ray head reachable there ({why} within {timeout:g} s)") from None


def _is_ray(p: psutil.Process) -> bool:
    """A process of Ray's: its servers and workers (ray::<task>), or a program of the ray package's."""
    try:
        name, cmd = p.name(), " ".join(p.cmdline())
    except psutil.Error:
        return False
    return name in ("gcs_server", "raylet") or name.startswith("ray::") or f"{os.sep}ray{os.sep}" in cmd


@dataclass
class RayCluster:
    """The cluster this process is connected to; `started_here` when this process started it."""

    address: str
    token: str | None  # the run's own cluster's token (None: an existing cluster's, set up the Ray way)
    started_here: bool
    temp_dir: str | None = None
    procs: list[psutil.Process] = field(default_factory=list)  # what `ray.init` started (started_here)
    before: set[int] | None = None  # this process's descendants before `up` (started_here)

    @classmethod
    def local(cls) -> RayCluster:
        """A head node to start on 127.0.0.1 (`up`), its token and temp folder made: hold it before `up`, so a
        signal while Ray starts still finds (`kill`) whatever has started by then."""
        temp = tempfile.mkdtemp(prefix="feedbench-ray-")
        if len(temp) + SOCKET_TAIL > SOCKET_LIMIT:
            shutil.rmtree(temp, ignore_errors=True)
            raise InputError(
                f"ray-data: the temp folder {temp} is too long for Ray's sockets (AF_UNIX: {SOCKET_LIMIT} bytes); "
                "set TMPDIR to a shorter folder"
            )
        token = secrets.token_hex(32)
        local_environment(token)
        # Ray's processes fall back to $TMPDIR/ray for what the head's temp folder does not name (seen: a `ray`
        # folder left in TMPDIR by a run on a loaded machine): RAY_TMPDIR, which they inherit, keeps that inside
        # the folder the run removes.
        os.environ["RAY_TMPDIR"] = temp
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        return cls("", token, True, temp, before=before)

    def up(self, cpus: int) -> None:
        """Start the head node with `cpus` CPUs, in the temp folder, without a dashboard; stopped on failure."""
        try:
            ctx = _quiet_init(
                num_cpus=cpus, num_gpus=0, _temp_dir=self.temp_dir, include_dashboard=False, _node_ip_address=LOOPBACK
            )
        except BaseException:
            self.stop()
            raise
        self.address = ctx.address_info["gcs_address"]
        self.procs = self._processes()

    @classmethod
    def join(cls, address: str, token: str | None, started_here: bool = False) -> RayCluster:
        """Connect this process to the cluster at `address` (another rank's, or --ray-address's)."""
        local_environment(token)
        _quiet_init(address=address)
        return cls(address, token, started_here)

    def server_cpu(self) -> dict[str, float | None]:
        """CPU seconds so far of each of the head's processes ("head <name> <pid>": the GCS, the raylet, Ray's
        agents) and of each worker ("worker <pid>": a raylet's child running tasks, named ray::<task>)."""
        out: dict[str, float | None] = {}
        for p in self._processes():
            try:
                name = p.name()
                worker = name.startswith("ray::") and not name.endswith("Agent")
                out[f"worker {p.pid}" if worker else f"head {name} {p.pid}"] = sum(p.cpu_times()[:2])
            except psutil.Error:
                continue
        return out

    def _processes(self) -> list[psutil.Process]:
        """What `up` started and, now, everything under it (the workers the raylet started since): held as
        psutil objects, so a process whose id was reused since is never touched."""
        found: dict[int, psutil.Process] = {}
        if self.before is not None:  # what ray.init has started under this process so far
            new = [p for p in psutil.Process().children(recursive=True) if p.pid not in self.before]
            found.update({p.pid: p for p in new if _is_ray(p)})
        for p in self.procs:
            try:
                found.update({q.pid: q for q in (p, *p.children(recursive=True))})
            except psutil.Error:
                continue
        return list(found.values())

    def stop(self) -> None:
        """Disconnect; a cluster started here is shut down, its processes killed and its folder removed."""
        try:
            import ray

            ray.shutdown()
        except Exception:  # the processes are killed below either way
            pass
        self.kill()

    def kill(self) -> None:
        """Kill what `up` started (and their children) by process id, and remove the temp folder."""
        procs = self._processes()
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        self.procs = []
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


# Why a worker ended, as the GCS records it (WorkerExitType): these two are the cluster's own doing (an idle
# worker let go, a job's workers at its end); any other is a death the run did not ask for.
_INTENDED = ("INTENDED_SYSTEM_EXIT", "INTENDED_USER_EXIT")


def job_id() -> str:
    """This driver's Ray job, hex: the tasks and actors of the pipeline it builds run under it."""
    import ray

    return ray.get_runtime_context().get_job_id()


def dead_workers(job: str) -> list[dict] | None:
    """The workers of Ray job `job` that died unasked ([{pid, ip, exit_type, detail}] in the order they died,
    from the GCS's worker table), or None where the table cannot be read. It is read through Ray's own state
    accessor: the public state API (`ray.util.state`) goes through the dashboard, which the run's own cluster
    does not start."""
    try:
        from ray._private.state import state
        from ray.core.generated import common_pb2, gcs_pb2

        table = state._connect_and_get_accessor().get_worker_table()
        exit_name = common_pb2.WorkerExitType.Name
        out = []
        for raw in table:
            w = gcs_pb2.WorkerTableData.FromString(raw)
            why = exit_name(w.exit_type) if w.HasField("exit_type") else "SYSTEM_ERROR"
            if w.is_alive or w.worker_type != common_pb2.WORKER or w.job_id.hex() != job or why in _INTENDED:
                continue
            detail = w.exit_detail.strip().split(". ")[0].rstrip(".")
            out.append(
                (w.end_time_ms, {"pid": w.pid, "ip": w.worker_address.ip_address, "exit_type": why, "detail": detail})
            )
        return [d for _, d in sorted(out, key=lambda x: x[0])]
    except Exception:  # a Ray whose internals moved: the run goes on without this figure
        return None


def process_use(first: dict[str, float | None], last: dict[str, float | None], dt: float) -> dict:
    """The head's servers' and each worker's CPU cores between two `server_cpu` readings `dt` seconds apart,
    and whether more Ray CPUs would help (the workers' business, as runner/data_service.py reads it)."""
    from runner.data_service import more_workers

    def cores(name: str) -> float | None:
        a, b = first.get(name), last.get(name)
        return (b - a) / dt if dt > 0 and a is not None and b is not None else None

    head = [cores(n) for n in first if n.startswith("head ")]
    workers = [{"worker": n, "cpu_cores": cores(n)} for n in first if n.startswith("worker") and n in last]
    return {
        "head_cpu_cores": sum(c for c in head if c is not None) if head else None,
        "workers": workers,
        "more_workers": more_workers([w["cpu_cores"] for w in workers]),
    }
