"""Standalone producers, started first, feed whatever runs come to them: every path, in turn, over every transport.

This is the README's workflow ("Producers"): one producer left running, then a
run of the default paths against it, each path a new consumer of the same
producer. And the README's own two commands, as written, on a machine without
a GPU (where the run shrinks its batches): both sides pass the same layout.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from pathlib import Path

import pytest
from path_lists import producer_paths

from wire.endpoints import free_tcp_port

ROOT = Path(__file__).resolve().parent.parent
PRODUCER_PATHS = producer_paths("torch")


def endpoint_for(transport: str, ipc_dir: str) -> str:
    return {
        "ipc": f"ipc://{ipc_dir}/feed",
        "tcp": f"tcp://127.0.0.1:{free_tcp_port()}",
        "shm": f"shm://t-{uuid.uuid4().hex[:12]}",
    }[transport]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["ipc", "tcp", "shm"])
def test_one_producer_feeds_a_default_run_of_every_path(procs, ipc_dir, tmp_path, transport) -> None:
    endpoint = endpoint_for(transport, ipc_dir)
    small = ("--batch", "2", "--image-size", "8")
    producer = procs.producer(endpoint, *small, "--workers", "2")
    out_json = tmp_path / "r.json"
    run = procs.start(
        "bench_input.py", "--endpoint", endpoint, *small, "--input-only", "--num-gpus", "1", "--warmup-steps", "1",
        "--steps", "2", "--repeats", "1", "--recv-timeout", "60", "--json", str(out_json),
    )  # fmt: skip
    _, err = run.communicate(timeout=540)
    assert run.returncode == 0, err
    paths = json.loads(out_json.read_text())["paths"]
    assert set(PRODUCER_PATHS) < set(paths), sorted(paths)
    for path in ("python-queue", "python-dataset"):  # the Python consumers count per producer
        rows = paths[path]["producers"]
        assert rows and all(r["received"] > 0 and r["duplicated"] == 0 for r in rows), (path, rows)
    assert producer.poll() is None, producer.stderr.read()  # still there for the next run
    producer.terminate()
    assert producer.wait(30) == 0


def readme_producer_commands() -> list[list[str]]:
    """The two commands of the README's "Producers" example: the producer, then the run."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Producers\n.*?```sh\n(.*?)```", text, re.S).group(1)
    lines = [ln.split("#")[0].strip() for ln in block.splitlines()]
    return [shlex.split(ln) for ln in lines if "-m producers synthetic" in ln or "bench_input.py" in ln]


@pytest.mark.timeout(600)
def test_the_readme_producer_example_works_as_written(procs) -> None:
    producer_cmd, run_cmd = readme_producer_commands()
    assert producer_cmd[:3] == [".venv/bin/python", "-m", "producers"] and run_cmd[1] == "bench_input.py"
    port = str(free_tcp_port())  # the README's port may be taken on a test machine; nothing else changes
    producer = procs.start(*[a.replace("5555", port) for a in producer_cmd[1:]])
    run = procs.start(*[a.replace("5555", port) for a in run_cmd[1:]])
    out, err = run.communicate(timeout=560)
    assert run.returncode == 0, err
    assert "zmq-consume" in out
    assert producer.poll() is None
    producer.terminate()
    assert producer.wait(30) == 0
