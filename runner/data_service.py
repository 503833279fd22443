"""The run's own tf.data service: a dispatcher and N workers, each a process of its own on 127.0.0.1.

They are a ProducerGroup (runner/producer_group.py) with other command lines:
each in its own process group, watched (one that exits fails the run, naming
itself, or with --on-producer-exit continue only once the dispatcher or every
worker is gone),
stopped with the run whatever ends it, and dying with the run when it is
killed outright (producers/parent.py). Each listens on its own loopback port
only (runner/bind_host.py: TensorFlow's gRPC servers have no bind address).
"""

from __future__ import annotations

import signal
import sys
import time

from core.errors import InputError
from producers import parent
from runner import bind_host
from runner.local_cluster import LOOPBACK, free_ports
from runner.producer_group import ProducerGroup

MODULE = "consumers.tf_service"  # the process: python -m consumers.tf_service dispatcher|worker --port P
WORKER_TIMEOUT_MS = 10000  # the dispatcher drops a worker it has not heard from for this long
BUSY_CORES = 0.75  # a worker using this many cores or more is busy: it would make more with more CPU


def become_server(port: int) -> str:
    """In a service process, before TensorFlow starts: listen on 127.0.0.1:`port` only, die with the run,
    exit at once on SIGTERM (a worker holds nothing worth saving; the dispatcher keeps no state). Its address."""
    own = f"{LOOPBACK}:{port}"
    bind_host.ensure(own, LOOPBACK, allow_remote=False)  # may run this command again with the shim preloaded
    parent.watch()
    # The default action, not a Python handler: the main thread waits in TensorFlow's server join, where a
    # Python handler would not run until SIGKILL came.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return own


class ServiceGroup(ProducerGroup):
    """A dispatcher (process 0) and `workers` workers (processes 1..N), started by `start()`."""

    members = "workers"

    def __init__(self, workers: int, on_exit: str = "stop") -> None:
        bind_host.library()  # built here, once, before the processes need it (ConfigError without a compiler)
        ports = free_ports(workers + 1)
        self.dispatcher = f"{LOOPBACK}:{ports[0]}"
        self.workers = [f"{LOOPBACK}:{p}" for p in ports[1:]]
        cmds = [[sys.executable, "-m", MODULE, "dispatcher", "--port", str(ports[0])]]
        cmds += [
            [sys.executable, "-m", MODULE, "worker", "--port", str(p), "--dispatcher", self.dispatcher]
            for p in ports[1:]
        ]
        self.names = [f"the dispatcher {self.dispatcher}"] + [
            f"service worker {i} ({a})" for i, a in enumerate(self.workers)
        ]
        super().__init__(cmds, f"grpc://{self.dispatcher}", on_exit=on_exit)

    @property
    def address(self) -> str:
        return f"grpc://{self.dispatcher}"

    def _how(self, i: int, code: int) -> str:
        return super()._how(i, code).replace(f"producer {i} ", f"{self.names[i]} ", 1)

    def exited(self) -> dict[int, str]:
        """As the producers', but the dispatcher counts as every worker: without it nothing is delivered."""
        out = super().exited()
        if 0 in out and self.procs:
            out.update({i: out[0] for i in range(1, len(self.procs)) if i not in out})
        return out

    def none_left(self, exited: dict[int, str]) -> bool:
        """The dispatcher gone, or every worker: the line that fails the run names the dispatcher, or the
        lowest-numbered worker."""
        return 0 in exited or (len(self.procs) > 1 and all(i in exited for i in range(1, len(self.procs))))

    def wait_ready(self, timeout: float) -> None:
        """Until every process listens on its port (InputError naming the one that exited or is late)."""
        ports = [bind_host.split(a)[1] for a in (self.dispatcher, *self.workers)]
        deadline = time.monotonic() + timeout
        waiting = list(range(len(ports)))
        while waiting:
            self.check()
            waiting = [i for i in waiting if not bind_host.listening(ports[i])]
            if waiting and time.monotonic() > deadline:
                raise InputError(f"{self.names[waiting[0]]} did not listen within {timeout:g} s")
            if waiting:
                time.sleep(0.1)


def worker_use(window: tuple[dict, dict], workers: list[str]) -> dict:
    """The head's (process 0) and each worker's CPU cores over `window` (two counters with `time` and
    `cpu_s`, one entry per process), and whether more workers would help."""
    w0, w1 = window
    dt = w1["time"] - w0["time"]
    cores = [
        (b - a) / dt if dt > 0 and a is not None and b is not None else None
        for a, b in zip(w0["cpu_s"], w1["cpu_s"], strict=True)
    ]
    return {
        "head_cpu_cores": cores[0] if cores else None,
        "workers": [{"worker": i, "address": a, "cpu_cores": c} for i, (a, c) in enumerate(zip(workers, cores[1:]))],
        "more_workers": more_workers(cores[1:]),
    }


def more_workers(cores: list[float | None]) -> str | None:
    """Whether more workers would help, from how busy the workers were over the timed steps."""
    known = [c for c in cores if c is not None]
    if not known:
        return None
    mean = sum(known) / len(known)
    if mean >= BUSY_CORES:
        return (
            f"yes: the workers were busy ({mean:.2f} cores each); more workers make more batches while this host "
            "has free cores, and on other hosts beyond that"
        )
    return (
        f"no: the workers were idle part of the time ({mean:.2f} cores each); what limits is after them "
        "(the transfer, the trainer's client, or the trainer)"
    )
