"""`--loader-only --epochs N` on real loaders: each epoch's first batch and worker start-up, with and without
persistent workers, and the flags it refuses.

Real processes: bench_input.py runs the examples' torchvision ImageFolder DataLoader over real JPEGs in a
process of its own, whose DataLoader starts its worker processes as in a training script.
"""

from __future__ import annotations

import json

import pytest
from schema import check_part

from tests import test_loader
from tests.test_loader import ROOT, TF_DATA, TV
from tests.test_loader_figures import run

data = test_loader.data  # the fixture: a small ImageNet-layout folder of real JPEGs

pytestmark = pytest.mark.timeout(300)

START_UP_S = 1.0  # what each DataLoader worker's worker_init_fn waits, besides its real work

LOADER = f"""
import importlib.util
import os
import sys
import time

from PIL import Image
from torch.utils.data import DataLoader, get_worker_info

spec = importlib.util.spec_from_file_location("tv_example", {str(ROOT / TV)!r})
example = importlib.util.module_from_spec(spec)
sys.modules["tv_example"] = example
spec.loader.exec_module(example)


def slow_start(worker_id):
    '''A worker's start-up: check every file of the folder, then wait for a (pretend) remote store.'''
    for path, _ in get_worker_info().dataset.samples:
        with Image.open(path) as img:
            img.verify()
    time.sleep({START_UP_S})


def make(data, persistent=False, batch_size=8, image_size=32):
    return DataLoader(example.make_dataset(data, image_size), batch_size=batch_size, shuffle=True, num_workers=2,
                      drop_last=True, worker_init_fn=slow_start, persistent_workers=persistent)
"""


@pytest.fixture(scope="module")
def slow_start_loader(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("epochs") / "slow_start.py"
    path.write_text(LOADER)
    return str(path)


@pytest.mark.timing
def test_without_persistent_workers_every_epoch_waits_for_its_workers_to_start_again(slow_start_loader, data, tmp_path):
    js = tmp_path / "epochs.json"
    code, out, err = run(
        "--loader", f"{slow_start_loader}:make", "--loader-arg", f"data={data}", "--loader-only", "--epochs", "3",
        "--json", str(js),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(js.read_text())
    block = doc["epochs"]
    check_part(block, "loader_epochs")
    assert (block["epochs"], block["kind"], block["num_workers"]) == (3, "dataloader", 2)
    runs = {r["persistent_workers"]: r for r in block["runs"]}
    assert [r["persistent_workers"] for r in block["runs"]] == [False, True]  # as the loader makes it, then not
    assert runs[False]["as_given"] and not runs[True]["as_given"]
    for r in runs.values():
        assert [e["epoch"] for e in r["epochs"]] == [1, 2, 3]
        assert all(e["batches"] == 2 and e["images"] == 16 for e in r["epochs"])  # 16 images, batches of 8
        assert len(r["boundaries"]) == 2
    # Events, not rates: each start-up waits START_UP_S in every new worker, and a first batch needs one.
    for e in runs[False]["epochs"]:
        assert e["workers_started"] == 2 and e["worker_init_s"] >= START_UP_S and e["first_batch_s"] >= START_UP_S
    first, *later = runs[True]["epochs"]
    assert first["workers_started"] == 2 and first["worker_startup_s"] >= START_UP_S
    assert all(e["workers_started"] == 0 and e["worker_startup_s"] is None for e in later)
    # The comparison: persistent workers make every later epoch's first batch come sooner.
    for without, with_ in zip(runs[False]["epochs"][1:], later, strict=True):
        assert with_["first_batch_s"] < without["first_batch_s"], (with_, without)
    saving = block["persistent_workers_saving"]
    assert saving["epochs_compared"] == [2, 3] and saving["saves_s"] > 0
    assert f"persistent_workers=True saves {saving['saves_s']:.2f} s" in out
    assert "persistent_workers=False (as the loader sets it):" in out and "epoch 1 -> 2: no batch for" in out


def test_a_dataset_batched_by_feedbench_reports_each_epoch_once(data, tmp_path):
    """A map-style Dataset has no worker processes: one run, every epoch's figures, and the note that says so."""
    js = tmp_path / "epochs.json"
    code, out, err = run(
        "--loader", f"{TV}:make_dataset", "--loader-arg", f"data={data}", "--loader-arg", "image_size=32",
        "--batch", "4", "--loader-only", "--epochs", "2", "--json", str(js),
    )  # fmt: skip
    assert code == 0, err
    block = json.loads(js.read_text())["epochs"]
    check_part(block, "loader_epochs")
    assert block["kind"] == "dataset" and len(block["runs"]) == 1 and block["persistent_workers_saving"] is None
    (r,) = block["runs"]
    assert r["persistent_workers"] is None
    assert [(e["epoch"], e["batches"], e["workers_started"]) for e in r["epochs"]] == [(1, 4, 0), (2, 4, 0)]
    assert all(e["first_batch_s"] > 0 for e in r["epochs"])
    assert "no worker processes to start" in out


def test_a_loader_file_whose_dataloader_spawns_its_workers_runs_both_ways(data, tmp_path):
    """Spawned DataLoader workers import the loader's file by its module name: it must be the one they find."""
    js = tmp_path / "epochs.json"
    code, out, err = run(
        "--loader", f"{TV}:make_loader", "--loader-arg", f"data={data}", "--loader-arg", "image_size=32",
        "--loader-arg", "batch_size=8", "--loader-arg", "num_workers=1", "--loader-arg", "start_method=spawn",
        "--loader-only", "--epochs", "1", "--json", str(js),
    )  # fmt: skip
    assert code == 0, err
    block = json.loads(js.read_text())["epochs"]
    check_part(block, "loader_epochs")
    assert [(r["persistent_workers"], r["as_given"]) for r in block["runs"]] == [(True, True), (False, False)]
    assert all(r["epochs"][0]["workers_started"] == 1 for r in block["runs"])
    assert block["persistent_workers_saving"] is None  # one epoch: no later epoch to compare
    assert "leaked" not in err  # the persistent worker was shut down, its queues released


def test_a_tf_data_pipeline_that_repeats_for_ever_is_refused_in_one_line(data):
    code, out, err = run(
        "--loader", f"{TF_DATA}", "--loader-arg", f"data={data}", "--loader-arg", "image_size=32", "--batch", "4",
        "--loader-only", "--epochs", "2", timeout=180,
    )  # fmt: skip
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and "repeats for ever (.repeat()): --epochs needs epochs that end" in lines[0], err
    assert "epoch 1:" not in out and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--epochs", "0", "--loader-only"], "argument --epochs: 0 must be at least 1"),
        (["--epochs", "2", "--fake-location", "gpu"], "--epochs 2: only with --loader-only"),
        (["--epochs", "2", "--loader-only", "--loader-workers", "2"], "--epochs runs one copy of the loader"),
    ],
)
def test_epochs_where_they_mean_nothing_are_refused_in_one_line(args, words):
    code, out, err = run("--loader", f"{TV}:make_loader", *args, timeout=120)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]  # TensorFlow's start-up lines aside
    assert len(lines) == 1 and words in lines[0], err
    assert "Traceback" not in err
    assert "epoch 1" not in out


def test_a_bin_without_a_batchs_time_or_without_time_gives_no_rate():
    """The rate per second across a change of epoch (profiler/epoch_report.py `rate_in`), on recorded readings:
    a bin that no batch's time falls in, or one of no length, is not measured (None), never 0 nor a rate from a
    time near zero; a bin inside one batch's time gives that batch's own rate; the report says "not measured"."""
    from profiler.epoch_report import boundaries, rate_in, run_text

    segments = [(0.0, 0.5, 8), (0.5, 1.0, 8), (1.0, 3.0, 8)]  # the last: a 2 s pause, then a batch
    assert rate_in(segments, 0.0, 1.0) == pytest.approx(16.0)
    assert rate_in(segments, 1.5, 2.5) == pytest.approx(4.0)  # 8 images over the batch's own 2 s
    assert rate_in(segments, 2.0, 2.0) is None  # no time
    assert rate_in(segments, 3.0, 4.0) is None  # after the last batch: nothing timed there
    assert rate_in([], 0.0, 1.0) is None
    passes = [{"start": 0.0, "times": [0.5, 1.0], "images": [8, 8], "end": 1.1},
              {"start": 1.2, "times": [3.0, 3.5], "images": [8, 8], "end": 3.6}]  # fmt: skip
    (b,) = boundaries(passes, 16.0)
    assert all(x["images_per_sec"] is not None for x in b["rates_per_sec"]) and b["slowest_images_per_sec"] == 4.0
    run = {"epochs": [], "steady_images_per_sec": None,
           "boundaries": [{**b, "rates_per_sec": [{"at_s": 0.0, "images_per_sec": None}], "dip": None}]}  # fmt: skip
    assert "+0 s not measured" in run_text(run)
