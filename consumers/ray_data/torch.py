"""`ray-data`: Ray Data's streaming executor makes the batches on a Ray cluster; each rank iterates its split.

Rank 0 starts the run's own cluster (or joins --ray-address's), builds the
pipeline (consumers/ray_data/pipeline.py) and splits it with
`streaming_split(world, equal=True)`: one coordinator hands each rank its
share, each image to one rank. The splits are sent to the other ranks over
the process group with the cluster's address (and its own cluster's token);
each rank connects to the cluster as a driver of its own and iterates its
split with `iter_batches(prefetch_batches=--ray-prefetch)`, pins each batch
on a GPU and copies it to the device through feeders/device_copy.py like
every path's. (`iter_torch_batches` would pin and copy in Ray's own way, and
it imports `ray.train`, which needs more than `ray[data]`: one device copy
for every path is what makes their figures comparable.) Each image's
sequence number is counted on the rank whose step took it, so the result
shows every image came once.

The split is iterated on a thread (feeders/torch.py `Prefetcher`), so a step
waits for each batch at most --recv-timeout: a cluster that stops delivering
ends the run with one line naming its address. Rank 0 watches the GCS for
workers of its job that die (Ray retries their tasks): each is named once
on the terminal and in the result, beside the images counted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from consumers.ray_data import pipeline, stats
from consumers.ray_data.cluster import RayCluster, dead_workers, job_id
from consumers.ray_data.loader_rows import checked_spec, loader_error
from consumers.ray_data.path import PATH, merge_ranges
from consumers.torch_half import RankContext, TorchInputPath, labels_of
from core.errors import InputError
from core.images.files import DatasetError
from core.registry import register
from feeders.torch import Prefetcher
from runner import shutdown


class Seen:
    """The sequence numbers a rank's steps took, as [start, end) ranges (a split hands out runs of them, in
    order within a block): a batch that goes on from the last range extends it, anything else starts one."""

    def __init__(self) -> None:
        self.received = 0
        self.ranges: list[list[int]] = []

    def add(self, seq: np.ndarray) -> None:
        for v in seq.tolist():
            self.received += 1
            if self.ranges and self.ranges[-1][1] == v:
                self.ranges[-1][1] = v + 1
            else:
                self.ranges.append([v, v + 1])

    def figures(self) -> dict:
        """Received, distinct (from the ranges joined), and the joined ranges for the merge over the ranks."""
        ranges = merge_ranges(self.ranges)
        return {"received": self.received, "distinct": sum(b - a for a, b in ranges), "ranges": ranges}


@register
class RayData(TorchInputPath):
    declaration = PATH

    cluster: RayCluster | None = None
    prefetch: Prefetcher | None = None
    WATCH_S = 2.0  # rank 0 reads the GCS's worker table at most this often

    def open(self, ctx: RankContext) -> None:
        super().open(ctx)
        cfg = self.cfg
        self.seen = Seen()
        self.seqs: deque[np.ndarray] = deque()  # the queued batches' sequence numbers, in the queue's order
        self.taken = 0
        self.batch_bytes = cfg.batch * (cfg.image_size * cfg.image_size * 3 + 4 + 8)  # images, labels, seqs
        self._window: tuple[dict, dict] | None = None
        self.died: dict[int, dict] = {}  # rank 0: the job's workers that died, by process id
        self._watched = 0.0
        self.hung = False  # a batch did not come within --recv-timeout: the cluster is killed, not asked to stop
        shutdown.register(self._killed)
        split = self._connect()  # before anything imports ray: the cluster's settings are read at its import
        self.split = split
        self.prefetch = Prefetcher(
            lambda: self._iterate(split), ctx.device, depth=1, timeout=cfg.recv_timeout, name="feedbench-ray-data",
            check=self._watch,
        )  # fmt: skip

    def _connect(self) -> Any:
        """This rank's split: rank 0 makes the cluster and the splits, and sends the others theirs."""
        import torch.distributed as dist

        ctx = self.ctx
        sent: list[Any] = [None]
        if ctx.rank == 0:
            try:
                sent = [self._start_and_split()]
            except Exception as e:  # Ray's errors run to many lines (its log tails): the run says the first
                sent = [{"error": (str(e).strip().splitlines() or [type(e).__name__])[0]}]
        if dist.is_initialized() and ctx.world > 1:
            dist.broadcast_object_list(sent, src=0)
        got = sent[0]
        if "error" in got:
            raise InputError(got["error"] if ctx.rank == 0 else f"rank 0 could not start Ray Data: {got['error']}")
        if ctx.rank != 0:
            self.cluster = RayCluster.join(got["address"], got["token"], got["started_here"])
        self.rows, self.job = got["rows"], got["job"]
        import ray.cloudpickle as pickle

        return pickle.loads(got["splits"][ctx.rank])

    def _start_and_split(self) -> dict:
        """Rank 0: the cluster started (or joined), the dataset built and split across the ranks."""
        cfg, ctx = self.cfg, self.ctx
        loader = checked_spec(cfg) if cfg.producer_kind == "loader" else None  # refused before Ray starts
        if cfg.ray_address:
            self.cluster = RayCluster.join(cfg.ray_address, None)
        else:
            self.cluster = RayCluster.local()
            self.cluster.up(cfg.ray_cpus)
        import ray.cloudpickle as pickle  # after the cluster: its settings are read when ray is imported

        batches = cfg.warmup_steps + cfg.steps * cfg.repeats
        self.rows = pipeline.rows_needed(batches, cfg.batch, ctx.world, cfg.ray_prefetch, cfg.ray_block_batches)
        data = cfg.data if cfg.producer_kind == "decode" else None
        try:
            ds = pipeline.dataset(
                self.rows, cfg.batch, cfg.image_size, data, cfg.ray_block_batches, loader, cfg.ray_cpus
            )
        except DatasetError as e:
            raise InputError(f"{PATH.name}: {e}") from None
        self.splits = ds.streaming_split(ctx.world, equal=True)  # kept: rank 0 owns the split's coordinator
        c = self.cluster
        return {
            "address": c.address, "token": c.token, "started_here": c.started_here, "rows": self.rows,
            "job": job_id(), "splits": [pickle.dumps(s) for s in self.splits],
        }  # fmt: skip

    def _iterate(self, split: Any) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(images, labels) as Ray hands them (their sequence numbers queued aside); a new pass over the split
        when one ends. Runs on the prefetch thread."""
        cfg = self.cfg
        kw = {"batch_size": cfg.batch, "prefetch_batches": cfg.ray_prefetch, "drop_last": True}
        passes = 0
        while True:
            empty = True
            for b in split.iter_batches(batch_format="numpy", **kw):
                empty = False
                self.seqs.append(b["seq"] + passes * self.rows)
                yield b["image"], b["label"]
            if empty:
                raise InputError(f"{PATH.name}: the split gave rank {self.ctx.rank} no batch")
            passes += 1

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            images, labels = self.prefetch.next()
        except TimeoutError:
            self.hung = True
            raise InputError(
                f"no batch from the Ray cluster at {self.cluster.address} within {self.cfg.recv_timeout:g} s"
            ) from None
        except Exception as e:
            raise self._died(e) from e
        self.seen.add(self.seqs.popleft())
        self.taken += 1
        return images, labels_of(labels)

    def _died(self, e: Exception) -> Exception:
        """A Ray worker's death that ended the iteration, as one line naming the worker; the user's loader's error
        raised in a worker, as its own line; any other error as is."""
        from ray.exceptions import RayActorError, WorkerCrashedError

        if (theirs := loader_error(e)) is not None:
            return theirs
        if not isinstance(e, (RayActorError, WorkerCrashedError)):
            return e
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [type(e).__name__]
        said = dict(ln.split(": ", 1) for ln in lines[1:] if ln.split(": ", 1)[0] in ("pid", "ip", "class_name"))
        pid = said.get("pid")  # the actor's own process, where Ray's error names it
        known = [d for d in dead_workers(self.job) or [] if pid is None or str(d["pid"]) == pid]
        d = known[-1] if known else None  # the last to die, where the error names none
        who = f"{d['pid']} on {d['ip']}" if d else f"{pid or '(pid unknown)'} on {said.get('ip', '(host unknown)')}"
        role = f" ({said['class_name']})" if "class_name" in said else ""
        why = f"{d['exit_type']}: {d['detail']}" if d else lines[0]
        return InputError(f"Ray worker {who}{role} of the cluster at {self.cluster.address} died ({why})")

    def check(self) -> None:
        """Between steps and while a step waits: rank 0 names, once each, the job's workers that died."""
        self._watch()

    def _watch(self) -> None:
        if self.ctx.rank == 0 and time.monotonic() - self._watched >= self.WATCH_S:
            self._note(dead_workers(self.job))

    def _note(self, dead: list[dict] | None) -> None:
        """Name on the terminal, once each, the workers in `dead` not named yet."""
        self._watched = time.monotonic()
        for d in dead or []:
            if d["pid"] not in self.died:
                self.died[d["pid"]] = d
                print(
                    f"  warning: {PATH.name}: Ray worker {d['pid']} on {d['ip']} died mid-run ({d['exit_type']}: "
                    f"{d['detail']}); Ray Data retries what it ran, and the result's images count what came",
                    flush=True,
                )

    # --- the stage contract: raw state -------------------------------------------------------------------------
    def counters(self) -> dict:
        return {
            "time": time.perf_counter(),
            "messages": self.taken,
            "bytes": self.taken * self.batch_bytes,
            "latency_s": None,
            "wait_s": None,
            "source": "Ray Data iterator (batches the steps took; payload bytes)",
            "ray_cpu": self.cluster.server_cpu() if self.cluster is not None and self.cluster.started_here else {},
        }

    def producer_figures(self, window: tuple[dict, dict] | None) -> dict | None:
        """No producers: the window is kept for the Ray processes' CPU over it (`result_fields`)."""
        self._window = window
        return None

    def result_fields(self) -> dict:
        return {"images": self.seen.figures(), "ray": self._ray()}

    def _ray(self) -> dict:
        """The cluster, how this rank iterated, the Ray processes' use over the window, and Ray Data's stats."""
        from consumers.ray_data.cluster import process_use
        from profiler.uncertainty import STEP_BATCHES, window_rate

        cfg = self.cfg
        c = self.cluster
        text = self._stats()
        out = {
            "address": c.address if c is not None else "",
            "started_here": bool(c and c.started_here),
            "cpus": cfg.ray_cpus if c is not None and c.started_here else None,
            "iterator": "iter_batches",
            "prefetch_batches": cfg.ray_prefetch,
            "block_batches": cfg.ray_block_batches,
            "pin_memory": self.ctx.device.type == "cuda",  # the prefetcher's ring of host buffers
            "operators": stats.operators(text),
            "iterator_stats": stats.iterator(text),
            "images_per_sec": None,
            "workers_died": self._died_in_run(),
        }
        if self._window is not None:
            w0, w1 = self._window
            dt = w1["time"] - w0["time"]
            got = w1["messages"] - w0["messages"]
            out["images_per_sec"] = window_rate(got * cfg.batch, dt, got, need=STEP_BATCHES)
            if w0["ray_cpu"]:
                out.update(process_use(w0["ray_cpu"], w1["ray_cpu"], dt))
        return out

    def _died_in_run(self) -> list[dict] | None:
        """Rank 0: the job's workers that died, each named on the terminal by now (None: the GCS's table could
        not be read; other ranks: None, the cluster's figures are rank 0's)."""
        if self.ctx.rank != 0:
            return None
        dead = dead_workers(self.job)
        self._note(dead)
        return None if dead is None else sorted(self.died.values(), key=lambda d: d["pid"])

    def _stats(self) -> str:
        try:
            return self.split.stats()
        except Exception as e:  # the figures go on without Ray's words
            return f"stats() failed: {e}"

    def describe(self) -> dict:
        """Who makes the batches: the Ray cluster's workers, for the verdict's advice when they limit."""
        out = super().describe()
        where = f"the run's own, {self.cfg.ray_cpus} CPUs" if not self.cfg.ray_address else self.cfg.ray_address
        what = f", running loader {self.cfg.loader}" if self.cfg.producer_kind == "loader" else ""
        out["batch_maker"] = {"kind": "external", "name": f"Ray Data on a Ray cluster ({where}){what}"}
        return out

    def close(self) -> None:
        """Leave the cluster once every rank is done with it; rank 0 then stops its own."""
        import torch.distributed as dist

        if self.prefetch is not None:
            self.prefetch.close()  # a thread still waiting on a hung cluster is left to the kill below
            self.prefetch = None
        self.split = None
        if dist.is_initialized() and self.ctx.world > 1 and not shutdown.stopping():
            try:
                dist.barrier()  # a rank still reading its split's stats needs rank 0's coordinator
            except Exception:  # another rank failed: stop anyway
                pass
        self.splits = None
        if self.cluster is not None:
            self.cluster.kill() if self.hung else self.cluster.stop()  # ray.shutdown could wait on it too
            self.cluster = None
        shutdown.unregister(self._killed)

    def _killed(self) -> None:
        """On SIGINT or SIGTERM: kill the cluster's processes and remove its folder, without asking Ray."""
        if self.cluster is not None:
            self.cluster.kill()
