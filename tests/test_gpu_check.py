"""`make gpu-check`: what it can show without a GPU, with TensorFlow's real placer.

On a machine with GPUs, `python -m benchmarks.gpu_check` compares the
placer's devices with the plan; here the same comparison runs on the CPU
towers a machine without a GPU builds, and on an op asked for a GPU that is
not there, which soft placement moves to the host: the check must name it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.gpu_check import ROOT, ratio_table
from core import gpus
from frameworks.tf_env import import_tf
from harness.tf import devices
from harness.tf.gpu_check import check_path, moved_ops, placed_devices
from tests.test_gpu_fallback import gpu_machine  # noqa: F401 (a fixture: nvidia-smi reporting two GPUs)

tf = import_tf()


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    if gpus.nvidia_gpus():
        pytest.skip("this machine has NVIDIA GPUs")
    p = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "gpu-check: no NVIDIA GPU on this machine (nvidia-smi -L, /proc/driver/nvidia/gpus): nothing to check"
    ]


@pytest.mark.parametrize("path, update", [("gpu", ("replicated", "cpu")), ("zmq-consume", ("parameter_server", "cpu"))])
def test_the_placer_puts_every_op_where_the_graph_asks(path, update):
    r = check_path(path, 2, update, has_gpu=False)  # towers on /cpu:0 and /cpu:1, as without a GPU
    assert r["checked"] > 1000  # every op of ResNet-50's towers, read back from the placer
    assert r["moved"] == []


def test_an_op_soft_placement_moves_is_named_with_both_devices():
    g = tf.Graph()
    with g.as_default(), tf.device("/gpu:0"):
        tf.identity(tf.compat.v1.Variable(tf.zeros([4], tf.uint8), name="batch"), name="read_batch")
    checked, moved = moved_ops(g, placed_devices(g, devices.session_config(1, has_gpu=False)))
    assert checked == 5
    assert "batch (VariableV2): /device:GPU:0 -> device:CPU:0" in moved
    assert "read_batch (Identity): /device:GPU:0 -> device:CPU:0" in moved


def test_the_ratio_table_has_a_row_per_path_and_a_column_per_trainer():
    table = ratio_table({"gpu": 1.0, "cpu": 0.5}, {"gpu": 1.0, "spdl": 0.91, "dali": None})
    assert table.splitlines() == [
        "| path | TensorFlow | PyTorch |",
        "|---|---|---|",
        "| gpu | 1.00 | 1.00 |",
        "| cpu | 0.50 | - |",
        "| spdl | - | 0.91 |",
        "| dali | - | n/a |",
    ]


# ---------------------------------------------- the check's own budget, and what it must fail on


def test_the_checks_step_caps_fit_in_eight_minutes_with_room_on_one_gpu():
    from benchmarks.gpu_check import BUDGET_S, SHORT_RUN, STEPS
    from harness.torch.gpu_check import PATHS, launches

    assert sum(cap for _, _, cap in STEPS) <= BUDGET_S <= 8 * 60 - 30
    for _, args, _ in STEPS[:2]:  # placement and the torch check: one GPU
        assert args[args.index("--num-gpus") + 1] == "1"
    assert SHORT_RUN[SHORT_RUN.index("--num-gpus") + 1] == "1"
    assert len(launches(PATHS)) == 2  # every torch path in one torchrun launch, zmq-consume over shm:// in another
    assert sorted(p for paths, _ in launches(PATHS) for p in paths) == sorted(
        ["zmq-consume" if p == "zmq-consume-shm" else p for p in PATHS]
    )


def result(windows: list[float], wait: float | None = None) -> dict:
    return {
        "images_per_sec": {"median": sorted(windows)[len(windows) // 2], "repeats": windows},
        "telemetry": {"input_wait_share": wait},
    }


def test_figures_in_bounds_pass():
    from benchmarks.gpu_check import figure_problems

    results = {
        "gpu": result([3000, 3010, 2990]),
        "cpu": result([1500, 1490, 1510], wait=0.5),
        "zmq-consume": result([2980, 3000, 2995], wait=0.01),
    }
    assert figure_problems("PyTorch", results, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)") == []


def test_a_baseline_a_path_beats_beyond_their_alternated_runs_interval_fails():
    from benchmarks.gpu_check import figure_problems

    beaten = result([3500, 3510, 3490], wait=0.0)
    beaten["interleaved"] = {"pairs": 3, "images_per_sec": [3500, 3510, 3490], "baseline_images_per_sec": [3000] * 3}
    results = {"gpu": result([3000, 3010, 2990]), "python-queue": beaten}
    (line,) = figure_problems("TensorFlow", results, "GPU 0: NVIDIA H100 80GB HBM3")
    assert line.startswith(
        "TensorFlow: the gpu baseline ran slower than python-queue beyond the interval of their alternated runs "
        "(ratio 1.1"
    ), line


def test_a_drift_between_runs_one_after_another_is_not_taken_for_a_broken_baseline():
    """The H200 run of docs/gpu.md: the fed paths, run after the baseline, 0.4-0.6% above it beyond their window
    intervals; in alternated runs the same machine's drift moves both sides, so it needs no tolerance."""
    from benchmarks.gpu_check import figure_problems

    drifted = result([3015, 3016, 3017], wait=0.0)
    results = {"gpu": result([3000, 3001, 2999]), "python-queue": drifted}
    assert figure_problems("PyTorch", results, "NVIDIA H200") == []
    drifted["interleaved"] = {
        "pairs": 3,
        "images_per_sec": [3015, 3001, 3016],
        "baseline_images_per_sec": [3000, 3001, 3017],
    }
    assert figure_problems("PyTorch", results, "NVIDIA H200") == []


def test_a_baseline_far_below_the_gpus_published_rate_fails():
    from benchmarks.gpu_check import figure_problems

    results = {"gpu": result([900, 910, 905])}
    assert figure_problems("PyTorch", results, "GPU 0: NVIDIA H100 80GB HBM3") == [
        "PyTorch: the gpu baseline trained 905 images/s, below 25% of the published H100 rate "
        "(7000 images/s, core/emulate.py)"
    ]
    assert figure_problems("PyTorch", results, "GPU 0: NVIDIA L4") == []  # no published rate: not bounded


def test_a_slowdown_its_input_wait_does_not_explain_fails():
    from benchmarks.gpu_check import figure_problems

    results = {"gpu": result([3000, 3010, 2990]), "dali": result([1500, 1490, 1510], wait=0.02)}
    assert figure_problems("PyTorch", results, "NVIDIA H200") == [
        "PyTorch: dali ran at 0.50 of the baseline (50% slower) but its telemetry says it waited for input 2% of "
        "the time"
    ]


def test_regions_cuda_refused_fail_the_torch_check():
    from harness.torch.gpu_check import shm_problem

    assert shm_problem({"zero_copy": True, "cuda_regions": {"registered": 4, "refused": 0}}) is None
    assert shm_problem({"zero_copy": False, "cuda_regions": {"registered": 3, "refused": 1}}) == (
        "CUDA refused to register 1 shared-memory region(s) (cudaHostRegister; 3 registered): those batches were "
        "copied from pageable memory"
    )


@pytest.fixture
def unseen_gpus_machine(gpu_machine):  # noqa: F811 (the imported fixture, used)
    """Two GPUs the driver (550, older than torch's CUDA 13 needs) reports and torch cannot see."""
    torch = pytest.importorskip("torch")
    if not (torch.version.cuda or "").startswith("13"):
        pytest.skip("torch here is not a CUDA 13 build")
    return gpu_machine("550.54.14")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", ["harness.torch.gpu_check", "harness.torch.bandwidth"])
def test_torch_that_cannot_see_the_drivers_gpus_fails_naming_the_driver_and_the_fix(unseen_gpus_machine, module):
    p = subprocess.run(
        [sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True, env=unseen_gpus_machine
    )
    assert p.returncode == 1, (p.stdout, p.stderr)
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert "this machine has 2 NVIDIA GPU(s) but torch sees none: NVIDIA driver 550.54.14 is too old for " in line
    assert line.endswith(
        "update the driver, or run `make install` again: it installs the torch build for this driver where PyTorch has one"
    )


@pytest.mark.timeout(400)
def test_make_gpu_check_fails_where_torch_cannot_see_the_drivers_gpus(unseen_gpus_machine):
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=unseen_gpus_machine,
    )
    assert p.returncode == 1, p.stdout
    assert p.stdout.splitlines()[-1] == "gpu-check: failed: tf placement, torch, tf"
    assert "gpu-check (PyTorch): this machine has 2 NVIDIA GPU(s) but torch sees none: NVIDIA driver 550" in p.stdout


def test_on_a_gpu_each_ratio_comes_from_alternated_runs_by_default():
    from core.config import INTERLEAVE_GPU, BenchConfig, apply_defaults

    def interleave(gpus: int, **kw) -> int:
        cfg = BenchConfig(paths=["gpu", "cpu"], **kw)
        apply_defaults(cfg, gpus)
        return cfg.interleave

    assert interleave(1) == INTERLEAVE_GPU == 3
    assert interleave(0) == 0  # CPU towers: runs one after another, as before
    assert interleave(1, interleave=0) == 0 and interleave(0, interleave=2) == 2  # the flag wins
    assert interleave(1, find_capacity=True, model="emulated") == 0  # a capacity search probes instead
