"""A batch that is not what the run expects stops the run at once, with one line that says so.

Wrong layouts (image size, batch size, dtype, number of tensors) from real external producers, on every path of
both trainers, through the real command line and through the code that receives them; and garbage (malformed
messages) from an external sender, named by the field it breaks. The receive timeout is far longer than the tests
wait, so only the batch check can end these runs.
"""

from __future__ import annotations

import os
import re
import textwrap

import numpy as np
import pytest
import zmq
from conftest import only_these_hold
from failing_runs import SMALL, TORCH_RUN, needs_torch, one_error, one_error_line, small, start, wait_for_line
from path_lists import producer_paths

from consumers.zmq_pull import PullConsumer
from core.config import BenchConfig
from core.errors import InputError
from harness.tf.run import run_path

pytestmark = pytest.mark.timeout(300)


def run_cli(procs, *args: str, timeout: float = 200):
    p = procs.start("bench_input.py", *args)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error")]


# An external producer of odd batches, built on the project's wire code (native format, producer 5).
ODD_SENDER = """
import sys
import numpy as np
import zmq
from wire import message

endpoint, kind = sys.argv[1], sys.argv[2]
sock = zmq.Context.instance().socket(zmq.PUSH)
sock.connect(endpoint)
images = np.zeros((2, 32, 32, 3), np.float32 if kind == "dtype" else np.uint8)
arrays = [images, np.zeros(2, np.int32)] + ([np.zeros(2, np.int32)] if kind == "count" else [])
seq = 0
while True:
    message.send(sock, arrays, producer_id=5, seq=seq)
    seq += 1
"""


# One tower: the batch check is made where a batch enters the run, the same for every tower.
RUN = ("--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "32", "--recv-timeout", "600")


CASES = [
    # (path, producer: synthetic flags or odd-sender kind, words the error line must hold)
    ("zmq-consume", ["--image-size", "48"], ["uint8 [2,48,48,3]", "uint8 [2,32,32,3]"]),
    ("python-queue", ["--image-size", "48"], ["producer 7", "uint8 [2,48,48,3]", "uint8 [2,32,32,3]"]),
    ("python-dataset", ["--image-size", "48"], ["producer 7", "uint8 [2,48,48,3]", "uint8 [2,32,32,3]"]),
    ("zmq-consume", ["--batch", "3"], ["[3", "the run expects uint8 [2,32,32,3], int32 [2]"]),
    ("python-dataset", ["--batch", "3"], ["producer 7", "int32 [3]", "int32 [2]"]),
    ("zmq-consume", "dtype", ["float", "uint8"]),
    ("python-queue", "dtype", ["producer 5", "float32 [2,32,32,3]", "uint8 [2,32,32,3]"]),
    ("zmq-consume", "count", ["3 tensors", "expects 2"]),
    ("python-dataset", "count", ["producer 5", "int32 [2], int32 [2]; the run expects"]),
]


# Launched: every zmq-consume case (the graph's shape checks and the op's dtype and count checks each
# make their own line) and one case of each Python path; the Python paths' other cases are refused by
# the same check (consumers/tf_pull.py's PullFlow), run in-process below on a real socket.
LAUNCHED = [c for c in CASES if c[0] == "zmq-consume"] + [CASES[1], CASES[2]]


def case_ids(cases: list) -> list[str]:
    return [f"{c[0]}-{c[1] if isinstance(c[1], str) else c[1][0][2:]}" for c in cases]


def start_odd_producer(procs, endpoint: str, producer):
    """The external producer of a case: the odd sender of a kind, or a real producer with other flags."""
    if isinstance(producer, str):
        return procs.start("-c", ODD_SENDER, endpoint, producer)
    return procs.producer(endpoint, "--batch", "2", "--image-size", "32", "--producer-id", "7", *producer)


@pytest.mark.parametrize("path, producer, words", LAUNCHED, ids=case_ids(LAUNCHED))
def test_an_unexpected_batch_stops_the_run_with_one_line(procs, ipc_dir, tmp_path, path, producer, words):
    """The whole run: exit 2, one line naming path, endpoint and both layouts, no JSON, nothing left running."""
    endpoint = f"ipc://{ipc_dir}/ext"
    external = start_odd_producer(procs, endpoint, producer)
    out_json = tmp_path / "r.json"
    code, out, err = run_cli(procs, "--fake-location", path, *RUN, "--endpoint", endpoint, "--json", str(out_json))
    assert code == 2, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"error: {path}: ") and endpoint in line
    for w in words:
        assert w in line, line
    assert "no batch" not in line and "Traceback" not in err
    assert not out_json.exists()
    # Nothing of the run is left: only the external producer (not the run's to stop) holds the endpoint.
    assert only_these_hold(endpoint, external.pid)


PYTHON_CASES = [c for c in CASES if c[0] != "zmq-consume"]


@pytest.mark.parametrize("path, producer, words", PYTHON_CASES, ids=case_ids(PYTHON_CASES))
def test_the_python_paths_name_every_unexpected_batch(procs, ipc_dir, path, producer, words):
    """The check both Python paths run on each batch, fed by the case's real producer process."""
    from tensorpack.dataflow import DataFlowTerminated

    from consumers.expect import BatchSpec, receive_cap
    from consumers.tf_pull import PullFlow

    endpoint = f"ipc://{ipc_dir}/ext"
    start_odd_producer(procs, endpoint, producer)
    with PullConsumer(endpoint, bind=True, recv_timeout=600, max_msg_size=receive_cap(2, 32)) as consumer:
        flow = PullFlow(consumer, BatchSpec.images(2, 32))
        with pytest.raises(DataFlowTerminated):
            next(iter(flow))
    for w in words:
        assert w in flow.error, flow.error
    assert "no batch" not in flow.error


@pytest.mark.timeout(300)
# The native op and a Python consumer, each with a receive cap of its own that such batches used to exceed.
@pytest.mark.parametrize("path", ["zmq-consume", "python-dataset"])
def test_batches_larger_than_the_run_expects_get_the_mismatch_line_not_a_silent_timeout(procs, tmp_path, path):
    """A producer left at its default 64x224x224 against a small run: received, then named (not dropped by ZMQ)."""
    from wire.endpoints import free_tcp_port

    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    external = procs.producer(endpoint)  # its defaults: 64 images of 224x224, 9.6 MB a batch
    run = ("--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "32", "--recv-timeout", "600")
    code, out, err = run_cli(procs, "--fake-location", path, *run, "--endpoint", endpoint)
    assert code == 2, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}: {endpoint}: "), lines
    for words in ("[64,224,224,3]", "uint8 [2,32,32,3], int32 [2]", "the same --batch and --image-size"):
        assert words in lines[0], lines
    assert external.poll() is None


# Bad messages from an external sender: one line naming the path, the endpoint and the field.
GARBAGE = textwrap.dedent(
    """
    import os, sys, time, zmq
    kind = sys.argv[2]
    message = {"magic": b"FEED" + bytes(60), "empty": b"", "random": os.urandom(300),
               "huge": (1).to_bytes(4, "little") + (4).to_bytes(4, "little") + (1).to_bytes(4, "little")
                       + (2).to_bytes(4, "little") + (1 << 40).to_bytes(8, "little")}[kind]
    sock = zmq.Context().socket(zmq.PUSH)
    sock.connect(sys.argv[1])
    while True:
        sock.send(message)
        time.sleep(0.05)
    """
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "path, kind, what",
    [
        ("python-queue", "magic", r"n_tensors: \d+ is outside"),
        ("python-dataset", "empty", r"message is empty|truncated|n_tensors"),
        ("zmq-consume", "random", r"bad zmq_ops message: "),
        ("python-dataset", "huge", r"nbytes"),
    ],
)
def test_garbage_from_an_external_sender_ends_the_run_in_one_line_naming_the_field(
    procs, ipc_dir, capfd, path, kind, what
):
    endpoint = f"ipc://{ipc_dir}/ext"
    procs.start("-c", GARBAGE, endpoint, kind)
    with pytest.raises(InputError) as e:
        run_path(small(endpoint=endpoint), path, False)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{path}: {endpoint}: "), line
    assert re.search(what, line), line
    assert "Traceback" not in capfd.readouterr().err, "no feeding-thread traceback on the way"
    assert not os.path.exists(endpoint[len("ipc://") :]), "the run removes the socket file it bound"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", producer_paths("tf"))
def test_garbage_from_an_external_sender_is_one_line_naming_path_and_endpoint(procs, tmp_path, ipc_dir, path):
    endpoint = f"ipc://{ipc_dir}/ext"
    p = start(procs, tmp_path, "--fake-location", path, *SMALL, "--warmup-steps", "1", "--steps", "2",
              "--repeats", "1", "--endpoint", endpoint, "--recv-timeout", "60")  # fmt: skip
    wait_for_line(p, "waiting for an external producer")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        rng = np.random.default_rng(0)
        sock.send(rng.integers(0, 256, 64, dtype=np.uint8).tobytes())  # random bytes: no valid header
        out, err = p.communicate(timeout=90)
    finally:
        sock.close()
        ctx.term()
    assert p.returncode == 2, err[-3000:]
    assert "Traceback" not in out, out[-3000:]
    line = one_error(err)
    assert line.startswith(f"error: {path}: {endpoint}: "), line
    assert "no batch within" not in line, "the cause is the bad message, not a timeout"


# An external producer of odd batches, built on the project's wire code (native format, producer 5).
TORCH_ODD_SENDER = """
import sys
import numpy as np
import zmq
from wire import message

endpoint, kind = sys.argv[1], sys.argv[2]
sock = zmq.Context.instance().socket(zmq.PUSH)
sock.connect(endpoint)
size = 48 if kind == "size" else 32
batch = 3 if kind == "batch" else 2
images = np.zeros((batch, size, size, 3), np.float32 if kind == "dtype" else np.uint8)
arrays = [images, np.zeros(batch, np.int32)] + ([np.zeros(batch, np.int32)] if kind == "count" else [])
seq = 0
while True:
    message.send(sock, arrays, producer_id=5, seq=seq)
    seq += 1
"""


TORCH_MISMATCH = [
    ("python-queue", "size", ["producer 5", "uint8 [2,48,48,3]", "the run expects uint8 [2,32,32,3], int32 [2]"]),
    ("python-queue", "batch", ["producer 5", "uint8 [3,32,32,3], int32 [3]", "expects uint8 [2,32,32,3]"]),
    ("python-queue", "dtype", ["producer 5", "float32 [2,32,32,3]", "expects uint8 [2,32,32,3]"]),
    ("python-queue", "count", ["producer 5", "int32 [2], int32 [2]; the run expects"]),
    ("python-dataset", "size", ["producer 5", "uint8 [2,48,48,3]", "the run expects uint8 [2,32,32,3], int32 [2]"]),
    ("python-dataset", "batch", ["producer 5", "int32 [3]", "expects uint8 [2,32,32,3], int32 [2]"]),
    ("python-dataset", "dtype", ["producer 5", "float32 [2,32,32,3]", "expects uint8 [2,32,32,3]"]),
    ("python-dataset", "count", ["producer 5", "int32 [2], int32 [2]; the run expects"]),
    ("zmq-consume", "size", ["48"]),
    ("zmq-consume", "dtype", ["float"]),
    ("zmq-consume", "count", ["3"]),
]


# One launch per input path: each path turns its refusal into the run's line on its own code path.
TORCH_LAUNCHED = [TORCH_MISMATCH[0], TORCH_MISMATCH[5], TORCH_MISMATCH[9]]


@pytest.mark.timeout(400)
@needs_torch
@pytest.mark.parametrize("path, kind, words", TORCH_LAUNCHED, ids=[f"{p}-{k}" for p, k, _ in TORCH_LAUNCHED])
def test_a_producer_of_the_wrong_layout_is_refused_on_every_path(procs, ipc_dir, tmp_path, path, kind, words):
    """The whole run, once per path: exit 2, one line naming path, endpoint and layouts, no JSON, nothing left.

    Every other kind of wrong batch is refused by the same receiving code, checked in-process below.
    """
    endpoint = f"ipc://{ipc_dir}/ext"
    rank0 = f"{endpoint}-r0" + ("-w0" if path == "python-dataset" else "")  # rank 0's endpoint (worker 0's)
    external = procs.start("-c", TORCH_ODD_SENDER, rank0, kind)
    out_json = tmp_path / "r.json"
    run = procs.start(
        "bench_input.py", *TORCH_RUN, "--num-gpus", "1", "--steps", "4", "--producers", "1", "--fake-location", path,
        "--endpoint", endpoint, "--json", str(out_json), "--recv-timeout", "600",
    )  # fmt: skip
    out, err = run.communicate(timeout=300)
    assert run.returncode == 2, (out, err)
    line = one_error_line(err)
    assert line.startswith(f"error: {path}: {rank0}"), line
    for w in words:
        assert w in line, line
    assert "no batch" not in line
    assert not out_json.exists()
    assert only_these_hold(endpoint, external.pid)


def refusal(path: str, folder: str) -> str:
    """What rank 0's receiving code raises on the first batch an external producer sends to it in `folder`."""
    import torch

    from consumers import declared
    from consumers.expect import receive_cap
    from consumers.python_dataset.torch import PullDataset
    from consumers.torch_half import RankContext

    cfg = BenchConfig(paths=[path], num_gpus=1, batch=2, image_size=32, producers=1, input_only=True)
    endpoint = f"ipc://{folder}/ext"
    cfg.endpoint, cfg.recv_timeout, cfg.max_msg_size = endpoint, 600.0, receive_cap(2, 32)
    if path == "python-dataset":  # what each loader worker runs, here without the loader's process around it
        source = PullDataset([f"{endpoint}-r0-w0"], cfg)
        with pytest.raises(ValueError) as e:
            next(iter(source))
        return str(e.value)
    reader = declared.get("torch", path)(cfg)  # the path a rank opens, reading rank 0's endpoint
    try:
        reader.open(RankContext(0, 1, 0, torch.device("cpu"), folder))
        with pytest.raises(ValueError) as e:
            reader.next()
    finally:
        reader.close()
    return str(e.value)


@pytest.mark.timeout(400)
@needs_torch
@pytest.mark.parametrize("path, kind, words", TORCH_MISMATCH, ids=[f"{p}-{k}" for p, k, _ in TORCH_MISMATCH])
def test_every_wrong_layout_is_named_by_the_code_that_receives_it(procs, ipc_dir, path, kind, words):
    """Each kind of wrong batch, on each path, sent by a real producer process to the rank's real receiver."""
    endpoint = f"ipc://{ipc_dir}/ext"
    rank0 = f"{endpoint}-r0" + ("-w0" if path == "python-dataset" else "")
    procs.start("-c", TORCH_ODD_SENDER, rank0, kind)
    message = refusal(path, ipc_dir)
    for w in words:
        assert w in message, message
    assert "no batch" not in message
