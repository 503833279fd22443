"""A batch that is not what the run expects stops the run at once, with one line that says so.

Each case runs the real command line against a real external producer on
--endpoint: the run binds, the producer connects and sends batches of another
image size, batch size, dtype or number of tensors. The receive timeout is
far longer than the test waits, so only the batch check can end these runs.
"""

from __future__ import annotations

import pytest
from conftest import only_these_hold


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
    from consumers.zmq_pull import PullConsumer

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
