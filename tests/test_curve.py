"""CURVE: an encrypted stream with the right keys flows; a peer without them gets nothing through."""

from __future__ import annotations

import subprocess
import sys

import pytest

from consumers.zmq_pull import PullConsumer, ReceiveTimeout
from wire import curve
from wire.endpoints import free_tcp_port

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not curve.available(), reason="libzmq without CURVE support"),
]


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    out = subprocess.run([sys.executable, "-m", "producers", "make-keys", str(d)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert {p.name for p in d.iterdir()} == {"server.key", "server.key_secret", "client.key", "client.key_secret"}
    return str(d)


def test_stream_with_matching_keys_flows(procs, keys):
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    with PullConsumer(endpoint, recv_timeout=30, curve_keys=keys) as c:
        procs.producer(endpoint, "--count", "3", "--batch", "2", "--image-size", "8", "--curve-keys", keys)
        assert [c.recv().header.seq for _ in range(3)] == [0, 1, 2]


@pytest.mark.parametrize("producer_keys", ["none", "other"])
def test_producer_without_the_keys_gets_nothing_through(procs, keys, tmp_path, producer_keys):
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    extra = [] if producer_keys == "none" else ["--curve-keys", str(curve.make_keys(tmp_path / "other"))]
    with PullConsumer(endpoint, recv_timeout=3, curve_keys=keys) as c:
        p = procs.producer(
            endpoint, "--count", "3", "--batch", "2", "--image-size", "8", "--give-up-after", "3", *extra
        )
        with pytest.raises(ReceiveTimeout):
            c.recv()
    assert p.poll() is None  # no consumer ever took a batch: it waits for one, as a producer started first does
    p.terminate()
    assert p.wait(30) == 0


def test_missing_key_file_is_one_clear_error(procs, tmp_path):
    p = procs.producer("ipc:///tmp/fb-curve-x", "--curve-keys", str(tmp_path))
    assert p.wait(30) == 2
    assert "client.key_secret is missing" in p.stderr.read()
