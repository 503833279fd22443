"""The PyTorch trainer's endpoints for external producers: named as docs/torch.md says, and removed after the run."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from consumers.torch_half import RankContext  # noqa: E402
from core.config import BenchConfig  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("given", ["shm://feed", "ipc:///tmp/feed"])
def test_rank_r_binds_the_given_name_with_r_as_the_docs_say(given):
    cfg = BenchConfig(paths=["zmq-consume"], endpoint=given)
    for rank in (0, 1):
        ctx = RankContext(rank=rank, world=2, local_rank=rank, device=torch.device("cpu"), tmpdir="/tmp/run/r0")
        assert ctx.endpoint(cfg, "zmq-consume") == f"{given}-r{rank}"
    docs = " ".join((ROOT / "docs" / "torch.md").read_text().split())
    assert "`--endpoint shm://NAME` for yours, rank r on `shm://NAME-r<r>`" in docs
    assert re.search(r"an `ipc://` path or a `shm://` name gets `-r<r>`", docs)


@pytest.mark.timeout(400)
def test_zmq_consume_on_an_ipc_endpoint_leaves_no_socket_file(procs, ipc_dir, tmp_path):
    """--endpoint ipc://X: rank 0 binds X-r0 with the native receiver, and the file goes with the run."""
    ep = f"ipc://{ipc_dir}/feed"
    bound = Path(f"{ipc_dir}/feed-r0")
    producer = procs.producer(f"{ep}-r0", "--batch", "2", "--image-size", "4")
    assert procs.torch_zmq_consume(ep, tmp_path / "r.json")["batches_trained"] == 12
    assert not bound.exists(), "the run left the ipc socket file it bound"
    producer.send_signal(signal.SIGTERM)
    producer.wait(30)
