"""Start the PyTorch trainer on torchrun: one process per device, on one machine or several.

`bench_input.py --framework torch` runs `python -m torch.distributed.run`
itself, with `--nproc-per-node` = `--num-gpus` and the multi-machine flags
(`--nnodes`, `--node-rank`, `--master-addr`, `--master-port`) passed through;
each node's launch starts its own ranks, and rank 0 (on node 0) writes the
combined result. Never a home-made launcher: torchrun does the rendezvous,
the environment of each rank, and tearing every rank down when one fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError
from torch_trainer.inputs.base import cpu_threads

ROOT = Path(__file__).resolve().parent.parent
RESULT_FILE = "result.json"


@dataclass
class Nodes:
    """Where this launch sits in a multi-machine run (one machine: the defaults)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port on one machine, 29500 across machines

    def check(self) -> None:
        if self.node_rank < 0 or self.node_rank >= self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank}: must be from 0 to --nnodes - 1 ({self.nnodes - 1})")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ConfigError(f"--master-port {self.master_port}: not a TCP port")


def torchrun_command(nproc: int, nodes: Nodes, config_file: str, result_dir: str) -> list[str]:
    """argv of one node's torchrun, starting `nproc` ranks of `python -m torch_trainer.run`."""
    port = nodes.master_port
    if port is None:
        if nodes.nnodes > 1:
            port = 29500
        else:
            from wire.endpoints import free_tcp_port

            port = free_tcp_port()
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(nproc),
        "--nnodes", str(nodes.nnodes),
        "--node-rank", str(nodes.node_rank),
        "--master-addr", nodes.master_addr,
        "--master-port", str(port),
        "--max-restarts", "0",
        "--log-dir", os.path.join(result_dir, "torchrun"),  # removed with the run's folder
        "--module", "torch_trainer.run",
        "--config", config_file,
        "--result-dir", result_dir,
    ]  # fmt: skip


def launch(nproc: int, nodes: Nodes, cfg_dict: dict, result_dir: str) -> tuple[int, dict | None, list[str]]:
    """Run torchrun to the end: (exit code, rank 0's combined result or None, the ranks' error lines)."""
    config_file = os.path.join(result_dir, "config.json")
    with open(config_file, "w") as f:
        json.dump(cfg_dict, f)
    # Each rank's intra-op threads: OMP_NUM_THREADS when the user set it (several "machines" sharing
    # one host want fewer), else this machine's cores shared by its ranks.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", str(cpu_threads(nproc)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    from runner import shutdown

    proc = subprocess.Popen(
        torchrun_command(nproc, nodes, config_file, result_dir),
        cwd=ROOT,
        env=env,
        start_new_session=True,
        preexec_fn=shutdown.unblock_in_child,
    )

    def stop() -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait()

    shutdown.register(stop)
    try:
        rc = proc.wait()
    finally:
        shutdown.unregister(stop)
    errors = []
    for name in sorted(os.listdir(result_dir)):
        if name.startswith("error-rank"):
            errors.append(Path(result_dir, name).read_text().strip())
    result_path = os.path.join(result_dir, RESULT_FILE)
    result = json.loads(Path(result_path).read_text()) if os.path.exists(result_path) else None
    return rc, result, errors
