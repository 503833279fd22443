"""Start the PyTorch trainer on torchrun: one process per device, on one machine or several.

`bench_input.py --framework torch` runs torchrun's launcher with
`--nproc-per-node` = `--num-gpus` and the multi-machine flags (`--nnodes`,
`--node-rank`, `--master-addr`, `--master-port`) passed through; each node's
launch starts its own ranks, and rank 0 (on node 0) writes the combined
result. Never a home-made launcher: torchrun does the rendezvous, the
environment of each rank, and tearing every rank down when one fails.

torchrun's launcher runs in-process in a small process of its own
(`python -m harness.torch.launch`), which adds what a run needs around it:

- it follows `bench_input.py`: the kernel sends it SIGTERM when the run dies,
  even by SIGKILL (PR_SET_PDEATHSIG), and torchrun then stops the ranks, which
  stop their producers; it removes the dead run's folder last. The ranks
  follow the launcher the same way (`follow_launcher`);
- it turns torchrun's ways of failing (a signal, a rank that exited) into a
  small JSON file instead of a traceback and a `ChildFailedError` report, so
  `bench_input.py` prints one line naming the path, the endpoint and the rank.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError
from core.machine import cpu_threads

ROOT = Path(__file__).resolve().parents[2]
RESULT_FILE = "result.json"
FAILURE_FILE = "launch-failure.json"  # the launcher's account of a failed launch
LAUNCHER_ENV = "FEEDBENCH_LAUNCHER_PID"  # the ranks' parent, which they follow


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


def torchrun_args(nproc: int, nodes: Nodes, config_file: str, result_dir: str) -> list[str]:
    """torchrun's arguments for one node, starting `nproc` ranks of `python -m harness.torch.run`."""
    port = nodes.master_port
    if port is None:
        if nodes.nnodes > 1:
            port = 29500
        else:
            from wire.endpoints import free_tcp_port

            port = free_tcp_port()
    return [
        "--nproc-per-node", str(nproc),
        "--nnodes", str(nodes.nnodes),
        "--node-rank", str(nodes.node_rank),
        "--master-addr", nodes.master_addr,
        "--master-port", str(port),
        "--max-restarts", "0",
        "--log-dir", os.path.join(result_dir, "torchrun"),  # removed with the run's folder
        "--module", "harness.torch.run",
        "--config", config_file,
        "--result-dir", result_dir,
    ]  # fmt: skip


def torchrun_command(nproc: int, nodes: Nodes, config_file: str, result_dir: str) -> list[str]:
    """argv of this node's launcher process: torchrun in-process, following this process (see the module doc)."""
    return [
        sys.executable, "-m", "harness.torch.launch", "--parent", str(os.getpid()), "--result-dir", result_dir, "--",
        *torchrun_args(nproc, nodes, config_file, result_dir),
    ]  # fmt: skip


def launch(nproc: int, nodes: Nodes, cfg_dict: dict, result_dir: str) -> tuple[int, dict | None, list[str]]:
    (
        """Run torchrun to the end: (exit code, rank 0's combined result or None, the failure lines, first the cause).

    The result holds `runs` (one per entry of the config's paths, in order: --interleave names a path more than
    once) and `paths` ({path: its run}) made from them."""
        ""
    )
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
            os.killpg(proc.pid, signal.SIGTERM)  # torchrun stops the ranks, the ranks their producers
        except ProcessLookupError:
            pass
        proc.wait()

    shutdown.register(stop)
    try:
        rc = proc.wait()
    finally:
        shutdown.unregister(stop)
    if shutdown.stopping():  # stopped by a signal: the watcher exits once everything is gone, with one line
        threading.Event().wait()
    result_path = os.path.join(result_dir, RESULT_FILE)
    result = json.loads(Path(result_path).read_text()) if rc == 0 and os.path.exists(result_path) else None
    if result is not None:  # the ranks write one result per run, in order; by path, each path's (last) run
        result["paths"] = dict(zip(cfg_dict["paths"], result["runs"], strict=True))
    return rc, result, failure_lines(result_dir, rc) if rc != 0 else []


# --- why a launch failed, in one line --------------------------------------------------------------


def _read_json(path: str) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def rank_place(result_dir: str, rank: int) -> str | None:
    """What rank `rank` was doing: `<path>: <endpoint>` (the rank writes it before each path), or None."""
    try:
        return Path(result_dir, f"at-rank{rank}.txt").read_text().strip() or None
    except OSError:
        return None


def failure_lines(result_dir: str, rc: int) -> list[str]:
    """Every line that explains a failed launch, the cause first.

    A rank's own line for a failure it understood (a producer that died, a
    batch that does not fit: exit code 2) comes first; then a rank killed by a
    signal (it could say nothing); then the other ranks' lines, which are
    often consequences (a peer that vanished mid all-reduce); then the
    launcher's own account. Ranks stopped by torchrun's SIGTERM are not causes.
    """
    ranks = []
    for name in os.listdir(result_dir):
        if name.startswith("error-rank") and name.endswith(".json"):
            doc = _read_json(os.path.join(result_dir, name))
            if doc:
                ranks.append((int(name[len("error-rank") : -len(".json")]), doc))
    ranks.sort()
    understood = [d["line"] for _, d in ranks if d.get("code") == 2]
    others = [d["line"] for _, d in ranks if d.get("code") != 2]
    launcher = _read_json(os.path.join(result_dir, FAILURE_FILE)) or {}
    killed, exited = [], []
    wrote = {r for r, _ in ranks}
    for f in sorted(launcher.get("failures", []), key=lambda f: (f["timestamp"], f["rank"])):
        code, rank = f["exitcode"], f["rank"]
        place = rank_place(result_dir, rank)
        where = f"{place}: " if place else ""
        if code < 0 and -code not in (signal.SIGTERM, signal.SIGINT):
            killed.append(f"{where}rank {rank} (pid {f['pid']}) exited, killed by {_signal_name(-code)}")
        elif rank not in wrote and code not in (128 + signal.SIGTERM, -signal.SIGTERM):
            exited.append(f"{where}rank {rank} (pid {f['pid']}) exited with code {code} and said nothing")
    tail = []
    if launcher.get("why"):
        tail.append(f"torchrun: {launcher['why']}")
    if rc < 0:
        tail.append(f"the torchrun launcher was killed by {_signal_name(-rc)}")
    elif rc > 128 and launcher.get("signal"):
        tail.append(f"the torchrun launcher was stopped by {_signal_name(rc - 128)}")
    lines = understood + killed + others + exited + tail
    return lines or [f"torchrun exited with code {rc}"]


# --- the launcher process: python -m harness.torch.launch --------------------------------------------


class _Stopped(BaseException):
    """A signal reached the launcher before torchrun took over its signals."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


def _stopped(signum: int, _frame) -> None:
    raise _Stopped(signum)


class _Records(logging.Handler):
    """torchrun's log records, kept instead of printed: the launcher's error line reads the last error."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.last = record.getMessage().strip().splitlines()[0]
        except Exception:  # a record that cannot format: keep the previous one
            pass


def follow_launcher() -> None:
    """In a rank: get SIGTERM when the launcher dies (and at once if it already has)."""
    from producers.parent import die_with_parent

    launcher = os.environ.get(LAUNCHER_ENV, "")
    if not launcher.isdigit():
        return
    die_with_parent(signal.SIGTERM)
    if os.getppid() != int(launcher):  # it died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def agent_main(argv: list[str] | None = None) -> int:
    """torchrun's launcher, in-process, following `--parent` and failing in a JSON file instead of a traceback."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stopped)
    p = argparse.ArgumentParser(prog="python -m harness.torch.launch")
    p.add_argument("--parent", type=int, required=True, help="the process to follow: its death stops the run")
    p.add_argument("--result-dir", required=True, help="the run's folder, removed here if the parent dies first")
    p.add_argument("torchrun", nargs=argparse.REMAINDER, help="torchrun's arguments, after --")
    a = p.parse_args(argv)
    args = a.torchrun[1:] if a.torchrun[:1] == ["--"] else a.torchrun
    from producers.parent import die_with_parent

    die_with_parent(signal.SIGTERM)
    os.environ[LAUNCHER_ENV] = str(os.getpid())  # the ranks inherit it
    # torchrun logs its warnings (closing signals, failures) to stderr; the run says what happened in one line.
    records = _Records()
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.ERROR)
    code, failure = 0, None
    try:
        if os.getppid() != a.parent:  # the parent died before we asked to follow it
            raise _Stopped(signal.SIGTERM)
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        _keep_torch_records(records)
        try:
            run(parse_args(args))
        except SignalException as e:
            code, failure = 128 + int(e.sigval), {"signal": int(e.sigval)}
        except ChildFailedError as e:
            rows = [
                {"rank": int(r), "pid": f.pid, "exitcode": f.exitcode, "timestamp": f.timestamp}
                for r, f in e.failures.items()
            ]
            code, failure = 1, {"failures": rows}
    except _Stopped as e:
        code, failure = 128 + e.sig, {"signal": e.sig}
    except Exception as e:  # the rendezvous, a bad argument: one line, not a traceback
        text = str(e).strip().splitlines()
        code, failure = 1, {"why": f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")}
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # done: nothing more to stop
            signal.signal(sig, signal.SIG_IGN)
        orphaned = os.getppid() != a.parent
    if failure is not None and not orphaned:
        _write_failure(a.result_dir, failure, records)
    if orphaned:  # nobody is left to read or remove the run's folder
        shutil.rmtree(a.result_dir, ignore_errors=True)
    return code


def _keep_torch_records(records: logging.Handler) -> None:
    """PyTorch gives many of its loggers a stderr handler of their own: keep their records instead."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch") and isinstance(logger, logging.Logger) and logger.handlers:
            for handler in logger.handlers:
                handler.setLevel(logging.CRITICAL + 1)
            logger.addHandler(records)


def _write_failure(result_dir: str, failure: dict, records) -> None:
    """The launcher's failure, for the run to say in one line (with torchrun's last log line when that is all)."""
    if records.last and "why" not in failure and "failures" not in failure:
        failure["log"] = records.last
    try:
        Path(result_dir, FAILURE_FILE).write_text(json.dumps(failure))
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(agent_main())
