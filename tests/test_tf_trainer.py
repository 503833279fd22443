"""The TensorFlow trainer (harness/tf/): every input path trains, towers stay in sync, the accounting adds up,
bad flags fail cleanly."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
from conftest import ROOT, Procs, taken_port
from tensorpack.callbacks import Callback

from consumers import declared
from core.config import BenchConfig, apply_defaults
from frameworks.tf_env import import_tf
from harness.tf.run import InputError, run_path

tf = import_tf()
pytestmark = pytest.mark.timeout(300)
PATHS = declared.default_run("tf")


def small(**kw) -> BenchConfig:
    base = {
        "batch": 2,
        "image_size": 32,
        "num_gpus": 1,
        "warmup_steps": 1,
        "steps": 2,
        "repeats": 1,
        "producers": 1,
        "recv_timeout": 30,
    }
    cfg = BenchConfig(**{**base, **kw})
    apply_defaults(cfg, gpus=0)
    return cfg


class GrabVariables(Callback):
    """Reads every global variable at the end of training, from inside the session."""

    def __init__(self) -> None:
        self.values: dict[str, np.ndarray] = {}

    def _after_train(self) -> None:
        # tensorpack keeps the other towers' replicas in LOCAL_VARIABLES.
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        for v, val in zip(variables, self.trainer.sess.run(variables)):
            self.values[v.op.name] = val


@pytest.mark.parametrize("path", PATHS)
def test_every_path_trains_resnet50_with_finite_loss(path):
    r = run_path(small(num_gpus=1), path, has_gpu=False)
    assert r["steps_run"] >= 3
    assert r["loss_finite"] and math.isfinite(r["final_loss"]) and r["final_loss"] > 0
    assert r["training"]["invalid"] is None and all(w["loss_finite"] for w in r["training"]["windows"])
    assert r["images_per_sec"]["median"] > 0


@pytest.mark.parametrize("path", PATHS)
def test_every_path_feeds_two_towers_in_input_only_mode(path):
    r = run_path(small(num_gpus=2, input_only=True, steps=3, repeats=2), path, has_gpu=False)
    assert r["steps_run"] >= 1 + 3 * 2
    assert len(r["images_per_sec"]["repeats"]) == 2
    assert r["images_per_sec_per_device"]["median"] == pytest.approx(r["images_per_sec"]["median"] / 2)


def test_replicated_towers_hold_equal_variables_after_training():
    grab = GrabVariables()
    run_path(small(num_gpus=2, variable_update="replicated"), "gpu", False, extra_callbacks=[grab])
    tower0 = {k: v for k, v in grab.values.items() if not k.startswith("tower") and "Momentum" not in k}
    tower1 = {k[len("tower1/") :]: v for k, v in grab.values.items() if k.startswith("tower1/") and "Momentum" not in k}
    weights = [k for k in tower0 if k.endswith("W") or "kernel" in k or "weights" in k]
    assert len(tower1) >= len(weights) > 50, "each tower must hold its own copy of the model"
    changed = 0
    for name, value in tower1.items():
        if name in tower0:
            np.testing.assert_allclose(value, tower0[name], rtol=1e-5, atol=1e-6, err_msg=name)
            changed += 1
    assert changed >= len(weights)


def test_parameter_server_keeps_one_copy_of_the_variables():
    grab = GrabVariables()
    run_path(small(num_gpus=2, variable_update="parameter_server"), "gpu", False, extra_callbacks=[grab])
    assert not [k for k in grab.values if k.startswith("tower1/")]
    trainable = sum(
        v.size
        for k, v in grab.values.items()
        if "Momentum" not in k and "EMA" not in k and "moving" not in k.lower() and "global_step" not in k
    )
    assert 23e6 < trainable < 27e6  # one ResNet-50 (with batch-norm statistics), not two


def test_endpoint_that_never_sends_fails_naming_it(ipc_dir):
    endpoint = f"ipc://{ipc_dir}/silent"
    cfg = small(num_gpus=1, input_only=True, endpoint=endpoint, recv_timeout=2)
    with pytest.raises(InputError, match="silent"):
        run_path(cfg, "python-queue", False)


# A Python consumer and the native op: the two kinds of code that bind a path's endpoint.
@pytest.mark.parametrize("path", ["python-queue", "zmq-consume"])
def test_an_endpoint_taken_after_the_runs_check_is_one_error_naming_path_and_endpoint(path):
    """Another process binds the port between bench_input.py's up-front check and the path's start."""
    with taken_port() as port:
        endpoint = f"tcp://127.0.0.1:{port}"
        words = rf"^{path}: (endpoint ')?{re.escape(endpoint)}'?: cannot bind: [Aa]ddress already in use$"
        with pytest.raises(InputError, match=words):
            run_path(small(num_gpus=1, input_only=True, endpoint=endpoint, recv_timeout=2), path, False)


# The command line, in real processes.


def run_cli(procs, *args: str, timeout: float = 240):
    p = procs.start("bench_input.py", *args)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error")]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--batch", "0"], ["--batch", "at least 1"]),
        (["--fake-location", "floppy"], ["--fake-location", "floppy"]),
        (["--num-gpus", "64"], ["--num-gpus 64"]),
        (["--variable-update", "horovod"], ["Horovod"]),
        (["--endpoint", "http://127.0.0.1:9"], ["http://127.0.0.1:9"]),
    ],
)
def test_bad_flags_give_one_clear_error_and_no_json(procs, tmp_path, args, words):
    out_json = tmp_path / "r.json"
    code, out, err = run_cli(procs, *args, "--json", str(out_json), timeout=120)
    assert code == 2
    text = err.strip().splitlines()[-1]
    for w in words:
        assert w in text
    assert not out_json.exists()


def test_silent_external_endpoint_stops_with_an_error_and_no_json(procs, ipc_dir, tmp_path):
    out_json = tmp_path / "r.json"
    endpoint = f"ipc://{ipc_dir}/ext"
    code, out, err = run_cli(
        procs, "--fake-location", "zmq-consume", "--input-only", "--endpoint", endpoint, "--recv-timeout", "2",
        "--batch", "2", "--image-size", "32", "--json", str(out_json),
    )  # fmt: skip
    assert code == 2, err
    assert endpoint in error_lines(err)[-1]
    assert "waiting for an external producer" in out
    assert not out_json.exists()


def test_zmq_consume_with_an_external_producer_writes_the_report(procs, ipc_dir, tmp_path):
    """--json alone writes the report, with every figure and no step clock in it, and no timeline (that comes
    with --out); the external producer is left running."""
    endpoint = f"ipc://{ipc_dir}/ext"
    producer = procs.producer(endpoint, "--batch", "2", "--image-size", "32", "--producer-id", "7")
    out_json = tmp_path / "r.json"
    code, out, err = run_cli(
        procs, "--fake-location", "zmq-consume", "--input-only", "--endpoint", endpoint, "--batch", "2",
        "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    assert set(doc["paths"]) == {"gpu", "zmq-consume"}
    z = doc["paths"]["zmq-consume"]
    assert z["ratio_to_baseline"] == pytest.approx(
        z["images_per_sec"]["median"] / doc["paths"]["gpu"]["images_per_sec"]["median"]
    )
    assert len(z["images_per_sec"]["repeats"]) == 2
    assert {"p50", "p90", "p99"} <= set(z["step_time_ms"])
    assert doc["config"]["batch"] == 2 and doc["device"]["cpu_cores"]
    assert "clock" not in json.dumps(doc)  # the step clocks go to the timeline, which --json alone does not write
    assert not list(ROOT.glob("timeline.*")) and not list(tmp_path.glob("timeline.*"))
    assert producer.poll() is None  # an external producer is not ours to stop


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory) -> Iterator[dict]:
    """One zmq-consume run fed by two producers it starts itself, decoding JPEGs from disk.

    It serves both the real-data test and the clean-up test: the producers are the run's own whatever they
    send, so one launch shows they feed the run and that none of them outlives it.
    """
    data = tmp_path_factory.mktemp("jpegs")
    tmp = tmp_path_factory.mktemp("run-tmp")  # the run's endpoint folder: its producers name it on their command line
    procs = Procs()
    try:
        made = procs.start("-m", "producers", "make-dataset", str(data), "--classes", "3", "--per-class", "4")
        assert made.wait(120) == 0
        p = procs.start(
            "bench_input.py", "--fake-location", "zmq-consume", "--input-only", "--producer-kind", "decode",
            "--data", str(data), "--batch", "2", "--image-size", "32", "--warmup-steps", "1", "--steps", "2",
            "--repeats", "1", "--producers", "2", env={**os.environ, "TMPDIR": str(tmp)},
        )  # fmt: skip
        out, err = p.communicate(timeout=240)
        left = [q for q in psutil.process_iter(["cmdline"]) if str(tmp) in " ".join(q.info["cmdline"] or [])]
        yield {"code": p.returncode, "out": out, "err": err, "left": left, "tmp": tmp}
    finally:
        procs.cleanup()


def test_run_started_producers_are_gone_after_the_run(decode_run):
    """The run's two producers are gone when it returns and its temporary folder under TMPDIR is removed."""
    assert decode_run["code"] == 0, decode_run["err"]
    assert "zmq-consume" in decode_run["out"] and "vs gpu" in decode_run["out"]
    assert not decode_run["left"], "a producer of the run outlived it"
    assert not list(decode_run["tmp"].iterdir()), "the run's temporary folder is removed"


def test_decode_producers_feed_the_run(decode_run):
    """--producer-kind decode: producers decoding real JPEGs feed zmq-consume to the end of its steps."""
    assert decode_run["code"] == 0, decode_run["err"]
    assert "zmq-consume" in decode_run["out"].split("input path")[-1]


def test_dali_producers_feed_the_run(procs, tmp_path):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install -e '.[dali]')")
    data = tmp_path / "data"
    made = procs.start("-m", "producers", "make-dataset", str(data), "--classes", "3", "--per-class", "4")
    assert made.wait(120) == 0
    code, out, err = run_cli(
        procs, "--fake-location", "zmq-consume", "--input-only", "--producer-kind", "dali", "--data", str(data),
        "--batch", "2", "--image-size", "32", "--warmup-steps", "1", "--steps", "2", "--repeats", "1", "--producers", "1",
    )  # fmt: skip
    assert code == 0, err
    assert "zmq-consume" in out.split("input path")[-1]


def test_decode_producer_without_data_is_one_clear_error(procs):
    code, out, err = run_cli(procs, "--producer-kind", "decode", timeout=60)
    assert code == 2
    assert "--data" in err.strip().splitlines()[-1]


def test_in_process_dali_path_trains(tmp_path, procs):
    pytest.importorskip(
        "nvidia.dali.plugin.tf", reason="DALI's TensorFlow plugin is not installed (pip install -e '.[dali]')"
    )
    data = tmp_path / "data"
    assert (
        procs.start("-m", "producers", "make-dataset", str(data), "--classes", "3", "--per-class", "4").wait(120) == 0
    )
    r = run_path(small(num_gpus=1, data=str(data)), "dali", has_gpu=False)  # one tower: the claim is the path
    assert r["loss_finite"] and r["steps_run"] >= 3


def test_zmq_consume_pulls_exactly_the_batches_the_steps_need():
    """Sequence numbers through the op: (warm-up + steps x repeats + 1 staged) x towers, none lost or repeated."""
    cfg = small(num_gpus=2, input_only=True, warmup_steps=2, steps=5, repeats=3, producers=2)
    r = run_path(cfg, "zmq-consume", has_gpu=False)
    needed = r["steps_run"]
    assert needed == 2 + 5 * 3 + r["schedule"]["untimed_steps"]
    assert r["batches_pulled"] == (needed + 1) * 2  # one batch per device waits in its StagingArea
    rows = r["producers"]
    # Producer i sends as id 1000*i (+ worker). Both run, but a short run may end before the second connects.
    assert rows and {row["producer"] for row in rows} <= {0, 1000} and all(row["received"] > 0 for row in rows)
    assert sum(row["received"] for row in rows) == r["batches_pulled"]
    assert all(row["lost"] == 0 and row["duplicated"] == 0 and row["restarts"] == 0 for row in rows)
