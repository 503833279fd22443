"""One task of a TensorFlow cluster run: a parameter server serves, a worker trains its input path and reports.

Every worker runs the input path with its own producers (or the external one
on its own --endpoint), exactly as a single-machine run does; the chief then
gathers every worker's result (harness/tf/cluster.py) and prints and writes the
cluster's report (profiler/cluster_report.py).
"""

from __future__ import annotations

import time

from core.config import BenchConfig
from harness.tf import cluster, devices
from harness.tf.run import run_path
from profiler import cluster_report
from runner.cluster_spec import ClusterConfig

# How long the chief waits for the other workers' results once its own training is over.
GATHER_TIMEOUT_S = 120.0


def session_config(cfg: BenchConfig, cc: ClusterConfig, has_gpu: bool):
    """The single-machine session config, seeing only the parameter servers and this worker."""
    config = devices.session_config(cfg.num_gpus, has_gpu)
    del config.session_inter_op_thread_pool[:]  # a distributed session refuses pool options; the server sizes its own
    config.device_filters.extend(["/job:ps", f"/job:worker/task:{cc.task_index}"])
    return config


def serve(cc: ClusterConfig) -> int:
    """A parameter server: serves until the chief's report is written (or the task is stopped)."""
    cluster.start_server(cc)  # a port that is taken stops the task here, before it says it serves
    print(f"ps {cc.task_index}: serving on {cc.ps_hosts[cc.task_index]}", flush=True)
    cluster.serve_ps(cc)
    return 0


def train(cfg: BenchConfig, cc: ClusterConfig, has_gpu: bool) -> dict | None:
    """Train this worker's path; on the chief, return the cluster's result (None on the others)."""
    path = cfg.paths[-1]
    cluster.start_server(cc, session_config(cfg, cc, has_gpu))
    digest = cluster.VariableDigest()
    waits = cluster.BarrierWait(cfg.warmup_steps)
    result = run_path(cfg, path, has_gpu, extra_callbacks=[digest, waits])
    result.pop("clock", None)  # a cluster task writes no timeline (docs/profiling.md)
    result["cluster"] = {
        "task_index": cc.task_index,
        "host": cc.worker_hosts[cc.task_index],
        "variables": digest.figures,
        **waits.figures(),
    }
    workers = cluster.gather_results(cc, result, GATHER_TIMEOUT_S)
    if workers is None:
        return None
    combined = cluster_report.combine(workers, cfg.num_gpus, cfg.variable_update)
    combined["cluster"] = {
        "mode": cfg.variable_update,
        "worker_hosts": cc.worker_hosts,
        "ps_hosts": cc.ps_hosts,
        "towers_per_worker": cfg.num_gpus,
    }
    return combined


def run_task(cfg: BenchConfig, cc: ClusterConfig, has_gpu: bool, trainer=None) -> int:
    """bench_input.py's entry for --job-name: returns the exit code (errors propagate as FeedbenchError).

    `trainer`: the TensorFlow plugin, whose words and machine the chief's --json report gives.
    """
    if cc.job_name == "ps":
        return serve(cc)
    path = cfg.paths[-1]
    started = time.time()
    print(
        f"{cc.name}{' (chief)' if cc.is_chief else ''} of {len(cc.worker_hosts)}: {path}, "
        f"{cfg.num_gpus} tower(s) x batch {cfg.batch}, {cfg.image_size}x{cfg.image_size}, {cfg.variable_update}, "
        f"{cfg.warmup_steps} warm-up + {cfg.repeats} x {cfg.steps} steps",
        flush=True,
    )
    result = train(cfg, cc, has_gpu)
    if result is None:
        print(f"{cc.name}: done; results handed to the chief", flush=True)
        return 0
    print()
    print(
        f"cluster: {len(cc.worker_hosts)} worker(s) x {cfg.num_gpus} tower(s), {len(cc.ps_hosts)} parameter server(s), "
        f"{cfg.variable_update}, {path}"
    )
    print(cluster_report.table(result))
    print("\n".join(cluster_report.summary_lines(result)))
    if cfg.json_path:
        from harness.run import run_document
        from profiler.report import write_json

        write_json(cfg.json_path, run_document(trainer, cfg, {path: result}, started))
        print(f"\nwrote {cfg.json_path}")
    return 0
