"""Who a process is in a TensorFlow cluster: the seeds' flags (--job-name, --task-index, --worker-hosts, --ps-hosts), checked.

Neutral (no TensorFlow): the local-cluster launcher builds these flags, the
TensorFlow worker reads them back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import ConfigError

MODES = ("distributed_replicated", "distributed_parameter_server")


@dataclass
class ClusterConfig:
    """This process's job and index, and every task's host:port."""

    job_name: str
    task_index: int
    worker_hosts: list[str]
    ps_hosts: list[str]
    address: str = ""  # the numeric address this task's server listens on (runner/bind_host.py)
    allow_remote: bool = False  # --allow-remote: the address may be beyond loopback

    @property
    def host_port(self) -> str:
        """This task's own entry of --worker-hosts / --ps-hosts."""
        return (self.worker_hosts if self.job_name == "worker" else self.ps_hosts)[self.task_index]

    @property
    def is_chief(self) -> bool:
        """Worker 0 initialises the variables and writes the cluster's report."""
        return self.job_name == "worker" and self.task_index == 0

    @property
    def name(self) -> str:
        return f"{self.job_name} {self.task_index}"

    def flags(self) -> list[str]:
        """The command-line flags that make a process this task."""
        return [
            "--job-name", self.job_name,
            "--task-index", str(self.task_index),
            "--worker-hosts", ",".join(self.worker_hosts),
            "--ps-hosts", ",".join(self.ps_hosts),
        ]  # fmt: skip


_HOST = re.compile(r"^(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9_.\-]+):(\d+)$")


def parse_hosts(flag: str, text: str | None) -> list[str]:
    """`host:port,host:port` -> list; raises ConfigError naming the flag and the bad entry."""
    if not text:
        raise ConfigError(f"{flag}: needs a comma-separated list of host:port")
    hosts = [h.strip() for h in text.split(",")]
    for h in hosts:
        m = _HOST.match(h)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise ConfigError(f"{flag}: {h!r} is not host:port")
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"{flag}: the same host:port appears twice")
    return hosts


def cluster_config(job_name: str | None, task_index: int | None, workers: str | None, ps: str | None) -> ClusterConfig:
    """Check the cluster flags together; one ConfigError line for the first problem."""
    if job_name not in ("worker", "ps"):
        raise ConfigError("--job-name worker|ps is needed with a distributed --variable-update")
    worker_hosts = parse_hosts("--worker-hosts", workers)
    ps_hosts = parse_hosts("--ps-hosts", ps)
    if set(worker_hosts) & set(ps_hosts):
        raise ConfigError("--worker-hosts and --ps-hosts share a host:port")
    index = 0 if task_index is None else task_index
    count = len(worker_hosts) if job_name == "worker" else len(ps_hosts)
    if not 0 <= index < count:
        raise ConfigError(f"--task-index {index}: the {job_name} job has tasks 0 to {count - 1}")
    return ClusterConfig(job_name, index, worker_hosts, ps_hosts)


def parse_local_cluster(text: str) -> tuple[int, int]:
    """`W,P` of --local-cluster -> (workers, parameter servers)."""
    parts = text.split(",")
    try:
        w, p = (int(x) for x in parts)
    except ValueError:
        raise ConfigError(f"--local-cluster {text}: expected WORKERS,PS (for example 2,1)") from None
    if w < 1 or p < 1:
        raise ConfigError(f"--local-cluster {text}: needs at least 1 worker and 1 parameter server")
    return w, p


def add_flags(parser) -> None:
    """The cluster flags of bench_input.py (tensorflow/benchmarks' names, dashed)."""
    g = parser.add_argument_group(
        "cluster (docs/cluster.md): --variable-update distributed_replicated|distributed_parameter_server"
    )
    g.add_argument("--job-name", choices=("worker", "ps"), help="this process's job in the cluster")
    g.add_argument("--task-index", type=int, help="this process's index in its job (default 0; worker 0 is the chief)")
    g.add_argument("--worker-hosts", metavar="HOST:PORT,...", help="every worker task, in task order")
    g.add_argument("--ps-hosts", metavar="HOST:PORT,...", help="every parameter server task, in task order")
    g.add_argument(
        "--local-cluster", metavar="W,P",
        help="start W workers and P parameter servers on this machine (loopback), run, report, stop them all",
    )  # fmt: skip


def from_args(args, cfg, sweep: bool) -> ClusterConfig | None:
    """Check a cluster run's flags: this task's ClusterConfig, or None for --local-cluster (which only launches).

    A cluster run trains one input path. `{task}` in --endpoint becomes the
    worker's index, so each worker of a local cluster binds its own.
    """
    if sweep:
        raise ConfigError("--sweep does not run on a cluster; sweep on one machine, or run each point as a cluster")
    if args.out:
        raise ConfigError("--out: a cluster run writes its report with --json (on the chief)")
    if not args.fake_location or "," in args.fake_location:
        raise ConfigError("a cluster run trains one input path: pass --fake-location with one")
    if args.local_cluster:
        workers, _ = parse_local_cluster(args.local_cluster)
        if args.job_name or args.task_index is not None or args.worker_hosts or args.ps_hosts:
            raise ConfigError(
                "--local-cluster picks the tasks and ports itself: drop --job-name/--task-index/--*-hosts"
            )
        if args.endpoint and workers > 1 and "{task}" not in args.endpoint:
            raise ConfigError(
                f"--endpoint {args.endpoint}: each worker binds its own; put {{task}} in it (tcp://127.0.0.1:56{{task}}0)"
            )
        return None
    cc = cluster_config(args.job_name, args.task_index, args.worker_hosts, args.ps_hosts)
    from runner import bind_host

    cc.allow_remote = bool(args.allow_remote)
    cc.address = bind_host.check_address(f"--{cc.job_name}-hosts", cc.host_port, cc.allow_remote)
    if cfg.endpoint:
        cfg.endpoint = cfg.endpoint.replace("{task}", str(cc.task_index))
    cfg.paths = [args.fake_location]
    return cc
