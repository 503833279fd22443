"""Training across processes and machines on TensorFlow's distributed runtime (between-graph replication).

Every worker process builds the same graph, trains its own towers on its own
input (its own producers), and meets the others on the parameter servers
(`tf.compat.v1.train.Server`) once per step. The trainers are tensorpack's
`DistributedTrainerReplicated` and `DistributedTrainerParameterServer`; their
graph builders and session creator call TensorFlow 1 names through TF 2's
namespace (`tf.train.replica_device_setter`, `tf.FIFOQueue`, `tf.get_variable`,
`tf.contrib...`), which TensorFlow 2.21 no longer has, so this module brings
v1 ports of those three pieces and keeps the rest of tensorpack's trainers.

When training ends every worker hands its result to the chief through a queue
on the first parameter server, so the chief writes one report for the cluster
without a shared file system; the chief then lets the workers and the
parameter servers exit.
"""

from __future__ import annotations

import hashlib
import json
import re
import time

import numpy as np
from tensorpack.callbacks import Callback
from tensorpack.graph_builder.training import DataParallelBuilder
from tensorpack.graph_builder.utils import (
    OverrideCachingDevice,
    allreduce_grads_naive,
    override_to_local_variable,
    split_grad_list,
)
from tensorpack.tfutils.common import get_global_step_var, get_op_tensor_name
from tensorpack.tfutils.tower import TrainTowerContext
from tensorpack.tfutils.varreplace import custom_getter_scope
from tensorpack.train.trainers import (
    DistributedTrainerBase,
    DistributedTrainerParameterServer,
    DistributedTrainerReplicated,
)
from tensorpack.utils.argtools import memoized

from core.errors import ConfigError, FeedbenchError
from frameworks.tf_env import import_tf
from runner import bind_host
from runner.cluster_spec import ClusterConfig

tf = import_tf()
v1 = tf.compat.v1

RESULTS_QUEUE = "feedbench_worker_results"
RELEASE_QUEUE = "feedbench_release_worker"
STOP_QUEUE = "feedbench_stop_ps"


_server = None


def start_server(cc: ClusterConfig, session_config=None):
    """Start this process's tf.compat.v1.train.Server (one per process); sessions on it use `session_config`."""
    global _server
    if _server is None:
        if cc.address:
            bind_host.check_free(cc.name, cc.host_port, cc.address)
        spec = tf.train.ClusterSpec({"worker": cc.worker_hosts, "ps": cc.ps_hosts})
        try:
            _server = v1.train.Server(spec, job_name=cc.job_name, task_index=cc.task_index, config=session_config)
        except (tf.errors.OpError, RuntimeError) as e:
            why = (getattr(e, "message", None) or str(e)).strip().splitlines()[0]
            raise FeedbenchError(f"{cc.name}: cannot start its server on {cc.host_port}: {why}") from None
        bind_host.check_listening(cc.name, cc.host_port, cc.allow_remote)
    return _server


def server():
    if _server is None:
        raise RuntimeError("no cluster server in this process: start_server() first")
    return _server


# ---------------------------------------------------------------------------------------------------------
# Graph builders: tensorpack's DistributedReplicatedBuilder / DistributedParameterServerBuilder, on v1 names.


def _as_local(getter, name, *args, **kwargs):
    """Create a global variable as a local one; leave the others alone.

    tensorpack's override_to_local_variable fails on a variable that is already
    local (its moving summaries nest a second override inside the first).
    """
    collections = set(kwargs.get("collections") or [v1.GraphKeys.GLOBAL_VARIABLES])
    if v1.GraphKeys.GLOBAL_VARIABLES in collections:
        collections.discard(v1.GraphKeys.GLOBAL_VARIABLES)
        collections.add(v1.GraphKeys.LOCAL_VARIABLES)
    kwargs["collections"] = list(collections)
    return getter(name, *args, **kwargs)


def _barrier_times(own_work: list, barriers: list, device: str) -> list:
    """[arrival, release]: wall-clock times (s) at which this worker reaches the step's barriers and passes them."""
    with v1.device(device):
        with tf.control_dependencies(own_work):
            arrival = tf.timestamp(name="barrier_arrival")
        with tf.control_dependencies(barriers):
            release = tf.timestamp(name="barrier_release")
    return [arrival, release]


class _Barriers:
    """Per-worker token queues on the parameter servers: the step barrier every worker waits at."""

    def __init__(self, cluster, task_index: int) -> None:
        self.num_worker = cluster.num_tasks("worker")
        self.task_index = task_index
        self.devices = [f"/job:ps/task:{i}/cpu:0" for i in range(cluster.num_tasks("ps"))]
        self.count = 0

    def barrier(self, name: str, dependencies: list):
        """An op that finishes when every worker has passed `dependencies` (tensorpack's sync queues)."""
        self.count += 1
        if self.num_worker == 1:  # nobody to wait for (and dequeue_many(0) on an empty queue would block)
            return tf.group(*dependencies, name=name)
        with v1.device(self.devices[self.count % len(self.devices)]):
            queues = [
                v1.FIFOQueue(self.num_worker, [tf.bool], shapes=[[]], shared_name=f"{name}{i}")
                for i in range(self.num_worker)
            ]
            token = tf.constant(False)
            ops = []
            with tf.control_dependencies(dependencies):
                ops += [q.enqueue(token) for i, q in enumerate(queues) if i != self.task_index]
            ops.append(queues[self.task_index].dequeue_many(len(queues) - 1))
            return tf.group(*ops, name=name)


class ReplicatedBuilder(DataParallelBuilder):
    """Each worker keeps local copies of the variables; gradients are applied to the copy on the PS and read back.

    The equivalent of tensorflow/benchmarks' `--variable_update distributed_replicated`
    (tensorpack's DistributedReplicatedBuilder, same graph).
    """

    def __init__(self, towers: list[int], server) -> None:
        super().__init__(towers)
        sd = server.server_def
        self.cluster = tf.train.ClusterSpec(sd.cluster)
        self.task_index = sd.task_index
        self.is_chief = self.task_index == 0
        prefix = f"/job:worker/task:{self.task_index}"
        self.param_server_device = v1.train.replica_device_setter(worker_device=prefix + "/cpu:0", cluster=self.cluster)
        self.cpu_device = prefix + "/cpu:0"
        self.raw_devices = [f"{prefix}/gpu:{i}" for i in towers]
        self.barriers = _Barriers(self.cluster, self.task_index)

    def build(self, get_grad_fn, get_opt_fn):
        """Returns (train op, op copying the PS variables into the towers, op syncing model variables or None)."""
        with override_to_local_variable():
            get_global_step_var()
        get_opt_fn = memoized(get_opt_fn)
        get_opt_fn()  # the optimizer's own variables (learning rate) are global
        grad_list = self._build_towers(get_grad_fn)
        DataParallelBuilder._check_grad_list(grad_list)
        all_grads, all_vars = split_grad_list(grad_list)
        all_grads = allreduce_grads_naive(all_grads, devices=self.raw_devices)
        avg_grads = list(zip(all_grads, all_vars[0], strict=True))
        with v1.device(self.param_server_device):
            ps_var_grads = [(g, self._shadow(v, trainable=True)) for g, v in avg_grads]
            updates = self._apply_and_copy(get_opt_fn(), grad_list, ps_var_grads)
            self.shadow_vars = [v for _, v in ps_var_grads]
            self.shadow_model_vars = self._shadow_model_variables()
        train_op = self.barriers.barrier("post_copy_barrier", [tf.group(*updates, name="main_fetches")])
        with tf.name_scope("initial_sync_variables"):
            initial_sync = self._initial_sync_op()
        model_sync = None
        if self.shadow_model_vars and self.is_chief:
            with tf.name_scope("sync_model_variables"):
                model_sync = tf.group(*[s.assign(v.read_value()) for s, v in self.shadow_model_vars])
        return train_op, initial_sync, model_sync

    def _build_towers(self, get_grad_fn) -> list:
        """tensorpack's build_on_towers with use_vs: each tower in its own variable scope, its variables local.

        With a local-variable scope that tolerates the ones nested inside it
        (the model's moving summaries): tensorpack's raises KeyError there.
        """
        grads = []
        for idx, device in enumerate(self.raw_devices):
            name = f"tower{idx}"
            with v1.device(device), TrainTowerContext(name, vs_name=name, index=idx, total=len(self.towers)):
                with custom_getter_scope(_as_local):
                    grads.append(get_grad_fn())
        return grads

    @staticmethod
    def _shadow(var, trainable: bool):
        """The global copy (on a PS) of tower variable `var`: same name without the tower prefix."""
        name = get_op_tensor_name(re.sub(r"^tower[0-9]+/", "", var.name))[0]
        return v1.get_variable(name, dtype=var.dtype.base_dtype, initializer=var.initial_value, trainable=trainable)

    def _shadow_model_variables(self) -> list:
        graph = v1.get_default_graph()
        have = {get_op_tensor_name(v.name)[0] for v in self.shadow_vars}
        pairs = []
        for v in v1.model_variables():
            op_name, tensor_name = get_op_tensor_name(re.sub(r"^tower[0-9]+/", "", v.name))
            if op_name in have:
                continue
            try:
                graph.get_tensor_by_name(tensor_name)
                continue
            except KeyError:
                pass
            shadow = self._shadow(v, trainable=False)
            have.add(op_name)
            self.shadow_vars.append(shadow)
            pairs.append((shadow, v))
        return pairs

    def _apply_and_copy(self, opt, grad_list, ps_var_grads) -> list:
        """Apply each gradient on the PS, wait for every worker's, then copy the new value into each tower."""
        updates, applies, barriers = [], [], []
        with tf.name_scope("apply_gradients"):
            for vid, (g, v) in enumerate(ps_var_grads):
                applied = opt.apply_gradients([(g, v)])
                applies.append(applied)
                barrier = self.barriers.barrier(f"param_update_barrier_{vid}", [applied])
                barriers.append(barrier)
                with tf.control_dependencies([barrier]), v1.device(self.cpu_device):
                    value = v.read_value()
                    updates += [grad_list[t][vid][1].assign(value) for t in range(len(self.towers))]
        self.barrier_times = _barrier_times(applies, barriers, self.cpu_device)
        return updates

    def _initial_sync_op(self):
        local = {get_op_tensor_name(v.name)[0]: v for v in v1.local_variables()}
        ops = []
        for v in self.shadow_vars:
            name = get_op_tensor_name(v.name)[0]
            for t in range(len(self.towers)):
                ops.append(local[f"tower{t}/{name}"].assign(v.read_value()))
        return tf.group(*ops, name=f"sync_{len(self.shadow_vars)}_variables_from_ps")


class _CachingDevice(OverrideCachingDevice):
    """tensorpack's OverrideCachingDevice, making its non-trainable variables local with the tolerant scope."""

    def __call__(self, getter, *args, **kwargs):
        size = tf.TensorShape(kwargs["shape"]).num_elements()
        if size is None or not kwargs.get("trainable", True):
            return _as_local(getter, *args, **kwargs)
        return super().__call__(getter, *args, **kwargs)


class ParameterServerBuilder(DataParallelBuilder):
    """One copy of every variable, spread over the PS tasks; each worker averages its towers' gradients and applies them.

    The equivalent of `--variable_update distributed_parameter_server` (tensorpack's
    DistributedParameterServerBuilder, with TensorFlow's round-robin placement in place
    of tf.contrib's GreedyLoadBalancingStrategy, which TensorFlow 2 does not have).
    """

    def __init__(self, towers: list[int], server, caching_device: str = "cpu") -> None:
        super().__init__(towers)
        sd = server.server_def
        self.cluster = tf.train.ClusterSpec(sd.cluster)
        self.task_index = sd.task_index
        self.is_chief = self.task_index == 0
        prefix = f"/job:worker/task:{self.task_index}"
        self.cpu_device = prefix + "/cpu:0"
        self.raw_devices = [f"{prefix}/gpu:{k}" for k in towers]
        self.caching_device = caching_device
        self.param_server_device = v1.train.replica_device_setter(worker_device=self.cpu_device, cluster=self.cluster)
        self.barriers = _Barriers(self.cluster, self.task_index)

    def build(self, get_grad_fn, get_opt_fn):
        devices = [v1.train.replica_device_setter(worker_device=d, cluster=self.cluster) for d in self.raw_devices]
        caching = self.raw_devices if self.caching_device == "gpu" else [self.cpu_device]
        getter = _CachingDevice(caching, self.cpu_device, 1024 * 64)
        with v1.variable_scope(v1.get_variable_scope(), custom_getter=getter):
            grad_list = DataParallelBuilder.build_on_towers(self.towers, get_grad_fn, devices)
        DataParallelBuilder._check_grad_list(grad_list)
        with v1.device(self.param_server_device):
            all_grads, all_vars = split_grad_list(grad_list)
            grads = list(zip(allreduce_grads_naive(all_grads), all_vars[0], strict=True))
            train_op = get_opt_fn().apply_gradients(grads, name="train_op")
        barrier = self.barriers.barrier("all_workers_sync_barrier", [train_op])
        self.barrier_times = _barrier_times([train_op], [barrier], self.cpu_device)
        return barrier


# ---------------------------------------------------------------------------------------------------------
# Trainers: tensorpack's, with the builders above and a v1 session creator.


def _session_creator(server):
    """tensorpack's get_distributed_session_creator on v1 names: the chief initialises, the others wait for it."""
    is_chief = server.server_def.job_name == "worker" and server.server_def.task_index == 0
    init_op = v1.global_variables_initializer()
    local_init_op = v1.local_variables_initializer()
    manager = v1.train.SessionManager(
        local_init_op=local_init_op,
        ready_op=v1.report_uninitialized_variables(),
        ready_for_local_init_op=v1.report_uninitialized_variables(v1.global_variables()),
        graph=v1.get_default_graph(),
        recovery_wait_secs=0.5,  # how often a worker looks whether the chief has initialised (default 30 s)
    )

    class Creator(v1.train.SessionCreator):
        def create_session(self):
            if is_chief:
                return manager.prepare_session(master=server.target, init_op=init_op)
            v1.logging.set_verbosity(v1.logging.INFO)  # says which variables it is waiting for
            try:
                return manager.wait_for_session(master=server.target)
            finally:
                v1.logging.set_verbosity(v1.logging.WARN)

    return Creator()


def _local_global_step():
    """Each worker counts its own steps in a local variable.

    tensorpack means it to be local ("gs should be local") but creates it in a
    fresh root variable scope, outside its local-variable override, so on
    TensorFlow 2 it comes out global, on each worker's own task, where the
    chief never initialises it and the other workers wait for it forever.
    """
    with v1.variable_scope(v1.VariableScope(reuse=False, name="")):
        return v1.get_variable(
            v1.GraphKeys.GLOBAL_STEP,
            shape=[],
            dtype=tf.int64,
            initializer=v1.zeros_initializer(),
            trainable=False,
            collections=[v1.GraphKeys.LOCAL_VARIABLES, v1.GraphKeys.GLOBAL_STEP],
        )


class _EveryWorker:
    """Every callback runs on every worker (tensorpack runs most only on the chief): each one times its own steps."""

    def register_callback(self, cb):
        for c in cb if isinstance(cb, (list, tuple)) else [cb]:
            c.chief_only = False
        return super().register_callback(cb)

    def initialize(self, session_creator, session_init):
        # The session config lives on the Server (cluster.server); the creator passed in is replaced.
        super(DistributedTrainerBase, self).initialize(_session_creator(self.server), session_init)


class ClusterReplicatedTrainer(_EveryWorker, DistributedTrainerReplicated):
    """tensorpack's DistributedTrainerReplicated with a builder that runs on TensorFlow 2.21."""

    def __init__(self, towers: list[int], server) -> None:
        DistributedTrainerBase.__init__(self, towers, server)
        self._builder = ReplicatedBuilder(towers, server)
        self.is_chief = self._builder.is_chief

    def _setup_input(self, input_signature, input):
        # As tensorpack's: the input's variables (queue-size summaries) are each worker's own.
        _local_global_step()
        with custom_getter_scope(_as_local):
            return input.setup(input_signature)


class ClusterParameterServerTrainer(_EveryWorker, DistributedTrainerParameterServer):
    """tensorpack's DistributedTrainerParameterServer with a builder that runs on TensorFlow 2.21."""

    def __init__(self, towers: list[int], server) -> None:
        DistributedTrainerBase.__init__(self, towers, server)
        self._builder = ParameterServerBuilder(towers, server)
        self.is_chief = self._builder.is_chief

    def _setup_input(self, input_signature, input):
        _local_global_step()
        return super()._setup_input(input_signature, input)


def make_trainer(mode: str, towers: int):
    """The distributed trainer for `--variable-update mode`, on this process's server."""
    srv = server()
    if mode == "distributed_replicated":
        return ClusterReplicatedTrainer(list(range(towers)), srv)
    if mode == "distributed_parameter_server":
        return ClusterParameterServerTrainer(list(range(towers)), srv)
    raise ConfigError(f"--variable-update {mode}: not a distributed mode")


# ---------------------------------------------------------------------------------------------------------
# What the workers report: their variables after the last step, and their results, gathered by the chief.


def _digest(values: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in values:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


class VariableDigest(Callback):
    """After the last step, fingerprints the trained variables as this worker sees them.

    `ps`: the global variables (on the parameter servers); `local`: the first
    tower's copies (distributed_replicated only). In sync, every worker's
    `local` equals its `ps`, and every worker reads the same `ps`.
    """

    chief_only = False

    def __init__(self) -> None:
        self.figures: dict = {}

    def _setup_graph(self) -> None:
        tower = re.compile(r"^tower[0-9]+/")
        self._global = sorted((v for v in v1.trainable_variables() if not tower.match(v.name)), key=lambda v: v.name)
        local = {v.name: v for v in v1.local_variables()}
        self._local = [local.get(f"tower0/{v.name}") for v in self._global]
        if any(v is None for v in self._local):
            self._local = []

    def _after_train(self) -> None:
        sess = self.trainer.sess
        ps = sess.run(self._global)
        self.figures = {"ps": _digest(ps), "sum": float(sum(np.sum(a, dtype=np.float64) for a in ps))}
        if self._local:
            self.figures["local"] = _digest(sess.run(self._local))


class BarrierWait(Callback):
    """How long each measured step of this worker waited at the barrier for the others.

    Workers step together, so their rates match; this says who waits: the
    worker the others wait for (the straggler) waits least.
    """

    chief_only = False

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.waits: list[float] = []
        self.steps: list[float] = []

    def _setup_graph(self) -> None:
        self._times = self.trainer._builder.barrier_times

    def _before_run(self, ctx):
        self._start = time.perf_counter()
        return v1.train.SessionRunArgs(fetches=self._times)

    def _after_run(self, ctx, values) -> None:
        arrival, release = values.results
        self.waits.append(max(0.0, float(release - arrival)))
        self.steps.append(time.perf_counter() - self._start)

    def figures(self) -> dict:
        waits, steps = self.waits[self.warmup :], self.steps[self.warmup :]
        if not waits:
            return {"barrier_wait_ms": None, "barrier_wait_share": None}
        return {
            "barrier_wait_ms": 1e3 * float(np.median(waits)),
            "barrier_wait_share": float(sum(waits) / sum(steps)) if sum(steps) > 0 else None,
        }


def _exchange_session(cc: ClusterConfig, graph):
    # Only this task and the parameter servers: a worker that has already left must not stall the session.
    config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{cc.task_index}"])
    return v1.Session(server().target, graph=graph, config=config)


def gather_results(cc: ClusterConfig, result: dict, timeout_s: float) -> list[dict] | None:
    """Hand this worker's result to the chief; on the chief, return every worker's, in task order.

    Through a string queue on the first parameter server: works across machines
    with no shared file system. Non-chief workers then wait until the chief has
    read them all, so no task leaves while another still needs it.
    """
    workers = len(cc.worker_hosts)
    graph = tf.Graph()
    with graph.as_default():
        with v1.device("/job:ps/task:0/cpu:0"):
            results = v1.FIFOQueue(workers, [tf.string], shapes=[[]], shared_name=RESULTS_QUEUE)
            release = v1.FIFOQueue(workers, [tf.bool], shapes=[[]], shared_name=RELEASE_QUEUE)
        if cc.is_chief:
            take = results.dequeue_many(workers - 1) if workers > 1 else tf.constant([], tf.string)
            let_go = release.enqueue_many([tf.fill([workers - 1], False)]) if workers > 1 else tf.no_op()
            stops = []
            for i in range(len(cc.ps_hosts)):
                with v1.device(f"/job:ps/task:{i}/cpu:0"):
                    q = v1.FIFOQueue(1, [tf.bool], shapes=[[]], shared_name=STOP_QUEUE)
                    stops.append(q.enqueue(False))
        else:
            put = results.enqueue(json.dumps(result))
            wait = release.dequeue()
    options = v1.RunOptions(timeout_in_ms=int(timeout_s * 1000))
    with _exchange_session(cc, graph) as sess:
        if not cc.is_chief:
            sess.run(put, options=options)
            try:
                sess.run(wait, options=options)  # the chief releases every worker once it has the results
            except tf.errors.DeadlineExceededError:
                raise FeedbenchError(
                    f"the chief did not collect this worker's results within {timeout_s:g} s"
                ) from None
            return None
        try:
            texts = sess.run(take, options=options)
        except tf.errors.DeadlineExceededError:
            raise FeedbenchError(f"the workers' results did not reach the chief within {timeout_s:g} s") from None
        sess.run(let_go)
        sess.run(stops)  # the parameter servers exit (serve_ps)
    others = [json.loads(t) for t in texts]
    return sorted([result, *others], key=lambda r: r["cluster"]["task_index"])


def serve_ps(cc: ClusterConfig, session_config=None) -> None:
    """A parameter server: serve variables and queues until the chief says the run is over."""
    srv = start_server(cc, session_config)
    graph = tf.Graph()
    with graph.as_default(), v1.device(f"/job:ps/task:{cc.task_index}/cpu:0"):
        stop = v1.FIFOQueue(1, [tf.bool], shapes=[[]], shared_name=STOP_QUEUE).dequeue()
    config = v1.ConfigProto(device_filters=[f"/job:ps/task:{cc.task_index}"])
    with v1.Session(srv.target, graph=graph, config=config) as sess:
        sess.run(stop)
