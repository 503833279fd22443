"""CURVE keys: a bad key folder is refused before anything runs; a refused handshake is named; keys lift --allow-remote.

Real processes and sockets: bench_input.py and producers are started as a user
starts them; what listens is read from the kernel.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from listening import wait_listening
from path_lists import producer_paths

from wire import curve
from wire.endpoints import free_tcp_port

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not curve.available(), reason="libzmq without CURVE support"),
]
SMALL = ["--num-gpus", "1", "--batch", "2", "--image-size", "16", "--input-only"]
STEPS = ["--warmup-steps", "1", "--steps", "2", "--repeats", "1"]


def make_keys(folder) -> str:
    out = subprocess.run([sys.executable, "-m", "producers", "make-keys", str(folder)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return str(folder)


def one_error(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


@pytest.mark.parametrize("path", producer_paths("tf"))
def test_a_missing_key_folder_is_refused_before_the_baseline(procs, tmp_path, path):
    missing = tmp_path / "no-keys"
    p = procs.start("bench_input.py", *SMALL, *STEPS, "--fake-location", path, "--curve-keys", str(missing))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, err[-3000:]
    line = one_error(err)
    assert f"--curve-keys {missing}: no such folder" in line, line
    assert "feedbench:" not in out, "nothing may run before the key folder is checked"


def test_a_key_folder_without_the_server_key_is_refused_up_front(procs, tmp_path):
    keys = make_keys(tmp_path / "keys")
    os.unlink(os.path.join(keys, "server.key_secret"))
    p = procs.start("bench_input.py", *SMALL, *STEPS, "--fake-location", "python-queue", "--curve-keys", keys)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, err[-3000:]
    assert "server.key_secret is missing" in one_error(err)
    assert "feedbench:" not in out


def test_python_dataset_names_the_refused_handshake(procs, tmp_path):
    keys = make_keys(tmp_path / "keys")
    other = make_keys(tmp_path / "other")
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    # A producer with another folder's keys: its handshakes are refused, so no batch ever arrives.
    producer = procs.producer(endpoint, "--batch", "2", "--image-size", "16", "--curve-keys", other)
    run = procs.start(
        "bench_input.py", *SMALL, *STEPS, "--fake-location", "python-dataset", "--endpoint", endpoint,
        "--curve-keys", keys, "--recv-timeout", "4",
    )  # fmt: skip
    out, err = run.communicate(timeout=240)
    assert run.returncode == 2, err[-3000:]
    line = one_error(err)
    assert line.startswith(f"error: python-dataset: {endpoint}: no batch within 4 s; "), line
    assert "connection attempt(s) refused by CURVE authentication; last: " in line, line
    assert producer.poll() is None  # it never fed anyone; it keeps waiting for a consumer
    producer.terminate()
    assert producer.wait(30) == 0


def test_a_bound_producer_with_keys_may_listen_on_every_interface(procs, tmp_path):
    keys = make_keys(tmp_path / "keys")
    port = free_tcp_port()
    p = procs.producer(f"tcp://0.0.0.0:{port}", "--bind", "--batch", "2", "--image-size", "8", "--curve-keys", keys)
    assert "0.0.0.0" in wait_listening(p, port)
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0, p.stderr.read()[-2000:]


def test_a_bound_producer_without_keys_on_every_interface_still_needs_allow_remote(procs):
    p = procs.producer(f"tcp://0.0.0.0:{free_tcp_port()}", "--bind")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "--allow-remote" in one_error(err)
