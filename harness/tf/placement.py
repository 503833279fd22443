"""Where the multi-device graph puts things: tensorpack's trainers, with the placements a GPU machine needs.

tensorpack 0.11 on TensorFlow 2 gets two placements wrong, so the trainers
here replace its builders where it does:

- parameter server: its builder spreads the variables over the GPUs whatever
  `ps_device` says (its `/cpu:0` branch is dead on TF 2). Here `ps_device="cpu"`
  puts every variable, its gradient sum and its update on `/cpu:0`, and
  `ps_device="gpu"` spreads them over the towers' GPUs, least loaded first.
- replicated: its default sums gradients with plain add ops; on GPUs this
  trainer all-reduces them with NCCL, as tensorflow/benchmarks does. Without
  a GPU there is no NCCL kernel, so CPU towers keep the add ops.

An input that must sit on its tower's device whatever device function the
trainer put around it asks `feeders.tf.tower_device()`.
"""

from __future__ import annotations

from tensorpack.graph_builder.training import DataParallelBuilder, SyncMultiGPUParameterServerBuilder
from tensorpack.train import SyncMultiGPUTrainerParameterServer, SyncMultiGPUTrainerReplicated
from tensorpack.train.tower import SingleCostTrainer

from frameworks.tf_env import import_tf

tf = import_tf()

TOWER_INPUTS = "feedbench_tower_inputs"  # graph collection: the batch each tower's model reads, tower by tower

# Ops that create a variable's storage: where they go, the variable lives.
VARIABLE_OPS = frozenset({"Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp"})


def _canonical(device: str) -> str:
    return tf.DeviceSpec.from_string(device).to_string()


class ParameterDeviceSetter:
    """A device function: variables on the least loaded parameter device, every other op on the worker.

    An op that already names a device keeps it (tower inputs name theirs, see
    `feeders.tf.tower_device`). `sizes` is shared by the towers' setters, so the
    balance holds across all of them.
    """

    def __init__(self, worker: str, ps_devices: list[str], sizes: list[int]) -> None:
        self.worker = _canonical(worker)
        self.ps_devices = [_canonical(d) for d in ps_devices]
        self.sizes = sizes

    def __call__(self, op) -> str:
        if op.device:
            return op.device
        if op.type not in VARIABLE_OPS:
            return self.worker
        i = min(range(len(self.ps_devices)), key=lambda k: self.sizes[k])
        self.sizes[i] += op.outputs[0].get_shape().num_elements() or 0
        return self.ps_devices[i]

    def __str__(self) -> str:  # tensorpack logs the tower's device
        return self.worker


class ParameterServerBuilder(SyncMultiGPUParameterServerBuilder):
    """tensorpack's parameter-server builder, with `ps_device` honoured on TensorFlow 2."""

    def call_for_each_tower(self, tower_fn):
        workers = [f"/gpu:{k}" for k in self.towers]
        ps_devices = ["/cpu:0"] if self.ps_device == "cpu" else workers
        sizes = [0] * len(ps_devices)
        setters = [ParameterDeviceSetter(w, ps_devices, sizes) for w in workers]
        return DataParallelBuilder.build_on_towers(self.towers, tower_fn, setters)

    # build() is tensorpack's: each gradient is summed where its variable lives, and with
    # ps_device="cpu" the updates run on /cpu:0; with "gpu" the optimizer colocates them.


class ParameterServerTrainer(SyncMultiGPUTrainerParameterServer):
    """SyncMultiGPUTrainerParameterServer built by `ParameterServerBuilder`."""

    def __init__(self, gpus: list[int], ps_device: str) -> None:
        if ps_device not in ("cpu", "gpu"):
            raise ValueError(f"ps_device must be 'cpu' or 'gpu', got {ps_device!r}")
        self.devices = list(gpus)
        self._builder = ParameterServerBuilder(self.devices, ps_device)
        SingleCostTrainer.__init__(self)


def make_trainer(variable_update: str, num_towers: int, ps_device: str, has_gpu: bool):
    """The tensorpack trainer for `--variable-update`, placed as on a machine with `num_towers` GPUs."""
    towers = list(range(num_towers))
    if variable_update == "replicated":
        # NCCL has no CPU kernel: CPU towers (the remap of a machine without a GPU) sum with add ops.
        return SyncMultiGPUTrainerReplicated(towers, average=True, mode="nccl" if has_gpu else "gpu")
    if variable_update == "parameter_server":
        return ParameterServerTrainer(towers, ps_device)
    raise ValueError(f"--variable-update {variable_update!r} is not supported here")
