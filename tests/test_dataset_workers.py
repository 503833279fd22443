"""PyTorch's python-dataset: its DataLoader workers are a setting of their own (--dataset-workers), not one per
producer, so a figure can be the path's at any worker count; more workers than producers are refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

SMALL = ["--framework", "torch", "--fake-location", "python-dataset", "--num-gpus", "1", "--batch", "2",
         "--image-size", "32", "--warmup-steps", "1", "--steps", "3", "--repeats", "2", "--input-only"]  # fmt: skip


def errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error")]


def test_one_worker_takes_every_producers_batches(procs, tmp_path):
    out = tmp_path / "r.json"
    p = procs.start("bench_input.py", *SMALL, "--producers", "2", "--dataset-workers", "1", "--json", str(out))
    _, err = p.communicate(timeout=280)
    assert p.returncode == 0, err[-2000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["dataset_workers"] == 1
    r = doc["paths"]["python-dataset"]
    rows = {row["producer"]: row for row in r["producers"]}
    # Both producers push to the one worker's endpoint (which of them a few batches came from is the sockets' choice).
    assert set(rows) <= {0, 1000} and sum(row["received"] for row in rows.values()) == r["batches_pulled"]
    assert all(row["lost"] == 0 and row["duplicated"] == 0 for row in rows.values())


def test_the_rank_binds_one_endpoint_per_worker_not_per_producer(tmp_path):
    import torch

    from consumers.python_dataset.torch import PythonDataset
    from consumers.torch_half import RankContext
    from core.config import BenchConfig
    from core.errors import ConfigError

    ctx = RankContext(0, 1, 0, torch.device("cpu"), str(tmp_path), str(tmp_path))

    def endpoints(**kw) -> list[str]:
        return PythonDataset(BenchConfig(paths=["python-dataset"], **kw)).endpoints(ctx)

    assert len(endpoints(producers=4)) == 4  # the default: one per producer, as before
    assert len(endpoints(producers=4, dataset_workers=2)) == 2
    with pytest.raises(ConfigError, match=r"--dataset-workers 3: rank 0 has 2 producer\(s\)"):
        endpoints(producers=2, dataset_workers=3)


@pytest.mark.parametrize(
    "args, line",
    [
        (["--producers", "2", "--dataset-workers", "3"],
         "error: --dataset-workers 3: more loader workers than producers (--producers 2); each worker needs a "
         "producer of its own to feed it"),
        (["--framework", "tf", "--dataset-workers", "1"],
         "error: --dataset-workers: PyTorch's python-dataset only; TensorFlow's pulls inside tf.data, in the trainer"),
    ],
)  # fmt: skip
def test_workers_no_producer_could_feed_are_refused_before_anything_starts(procs, args, line):
    p = procs.start("bench_input.py", *SMALL, *args)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and errors(err) == [line], err[-2000:]
