"""`--loader-only --tune`: the smallest setting of a real loader that meets a demand, or its shortfall and limit.

Real loaders throughout (the examples' torchvision ImageFolder DataLoader,
tf.data pipeline and tensorpack DataFlow) on real JPEGs, each setting in
fresh processes, through `bench_input.py`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.schema import check_part
from tests.test_loader import TIMED_LOOP, error_lines, finish, left_in_session, start

ROOT = Path(__file__).resolve().parent.parent
TV = "examples/torchvision_imagefolder.py:make_loader"
TF_DATA = "examples/tf_data_jpeg.py:make_dataset"
DATAFLOW = "examples/tensorpack_dataflow.py:make_dataflow"
SMALL = ["--loader-arg", "batch_size=4", "--loader-arg", "image_size=32"]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """A small ImageNet-layout folder of real JPEGs (the bundled photographs)."""
    root = tmp_path_factory.mktemp("tune-data") / "data"
    subprocess.run(
        [sys.executable, "-m", "producers", "make-dataset", str(root), "--classes", "2", "--per-class", "8"],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return str(root)


def tune(loader: str, data: str, *flags: str, json_path: Path) -> tuple[dict, str]:
    """Run --tune to its end; (its JSON, what it printed), nothing of it left running."""
    p = start("bench_input.py", "--loader", loader, "--loader-arg", f"data={data}", *SMALL, "--loader-only",
              "--tune", *flags, "--json", str(json_path))  # fmt: skip
    code, text, err = finish(p, 300)
    assert code == 0, err[-3000:]
    assert left_in_session(p.pid) == []
    doc = json.loads(json_path.read_text())
    check_part(doc["tune"], "loader_tune")
    return doc, text


def dataloader_from(line: str, data: str):
    """The printed line, evaluated as the user's code would run it: a DataLoader over the example's dataset."""
    from torch.utils.data import DataLoader

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import torchvision_imagefolder as ex
    finally:
        sys.path.pop(0)
    call = line.split("  #")[0]
    assert isinstance(ast.parse(call, mode="eval").body, ast.Call), line
    return eval(call, {"DataLoader": DataLoader, "dataset": ex.make_dataset(data, image_size=32)})


def test_a_demand_the_dataloader_meets_gives_the_line_to_paste(data, tmp_path):
    """A demand far below the loader's rate: met by the cheapest setting, which is printed as a DataLoader call."""
    doc, text = tune(TV, data, "--target-rate", "20", "--loader-seconds", "1", json_path=tmp_path / "t.json")
    tu = doc["tune"]
    assert tu["kind"] == "dataloader" and tu["shortfall"] is None
    assert [t["setting"]["num_workers"] for t in tu["tried"]] == [0]  # stopped at the first that meets it
    chosen = tu["chosen"]
    assert chosen["meets"] and chosen["images_per_sec"] >= 20 and chosen["cpu_cores"] > 0 and chosen["rss_mb"] > 0
    assert chosen["interval"] is None or chosen["interval"][0] <= chosen["interval"][1]
    assert chosen["line"] in text and "the smallest setting that meets it" in text
    assert "pin_memory: not tried: no NVIDIA GPU here" in text
    loader = dataloader_from(chosen["line"], data)
    assert (loader.batch_size, loader.num_workers, loader.drop_last) == (4, 0, True)
    assert type(loader.sampler).__name__ == "RandomSampler"  # the example's shuffle=True, kept
    assert "generator" in chosen["line"].split("#")[1]  # the example's own generator, named as kept


def test_a_setting_with_workers_is_made_again_and_pasted_as_a_working_call(data):
    """The probe reads the example's DataLoader; the line for a setting with workers builds one that runs."""
    from core.loader_spec import LoaderSpec
    from profiler.tune_report import paste_line
    from runner.loader_only import Options
    from runner.loader_tune import probe

    spec = LoaderSpec.parse(TV, [f"data={data}", "batch_size=4", "image_size=32"])
    info = probe(Options(spec))
    assert info["arguments"] == {"batch_size": 4, "drop_last": True, "shuffle": True}
    assert info["settings"] == {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": False}
    setting = {"num_workers": 1, "prefetch_factor": 4, "persistent_workers": True, "pin_memory": False}
    loader = dataloader_from(paste_line(spec, info, setting), data)
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (1, 4, True)
    images, labels = next(iter(loader))
    assert tuple(images.shape) == (4, 32, 32, 3) and len(labels) == 4


def test_a_demand_no_setting_meets_names_the_shortfall_and_the_limiting_stage(data, tmp_path):
    """An absurd demand: every setting up to one worker is measured, the best falls short by a ratio, and the
    per-stage timing names the stage that limits it."""
    doc, text = tune(TV, data, "--target-rate", "1e9", "--loader-workers", "1", "--loader-seconds", "0.5",
                     json_path=tmp_path / "t.json")  # fmt: skip
    tu = doc["tune"]
    assert tu["chosen"] is None
    assert [(t["setting"]["num_workers"], t["setting"]["prefetch_factor"], t["setting"]["persistent_workers"])
            for t in tu["tried"]] == [(0, None, None), (1, 2, False), (1, 2, True), (1, 4, True)]  # fmt: skip
    assert all(t["images_per_sec"] > 0 and not t["meets"] for t in tu["tried"])
    s = tu["shortfall"]
    assert s["best"]["images_per_sec"] == max(t["images_per_sec"] for t in tu["tried"])
    assert s["ratio"] == pytest.approx(s["best"]["images_per_sec"] / 1e9)
    stage = s["limit"]["slowest_stage"]["stage"]
    assert stage in ("read", "decode", "RandomResizedCrop", "RandomHorizontalFlip", "ToUint8HWC")
    assert "x short" in text
    if s["limit"]["slowest_stage"]["tied_with"]:  # stages the samples cannot tell apart: named together
        assert f"the limit is one of the stages {stage} (" in text and "a tie" in text, text
    else:
        assert f"the limit is the stage {stage}" in text


PLAIN_LOOP = (
    """
import sys, time
sys.path.insert(0, sys.argv[1])
import torchvision_imagefolder as ex
from torch.utils.data import DataLoader
loader = eval(sys.argv[3], {"DataLoader": DataLoader, "dataset": ex.make_dataset(sys.argv[2], image_size=32)})
"""
    + TIMED_LOOP
)


@pytest.mark.timing
def test_the_printed_setting_delivers_its_rate_within_its_interval_in_a_plain_loop(data, tmp_path):
    """The line --tune prints, pasted into a plain training loop (a fresh process), gives the rate it said."""
    doc, _ = tune(TV, data, "--target-rate", "20", "--loader-seconds", "3", json_path=tmp_path / "t.json")
    chosen = doc["tune"]["chosen"]
    call = chosen["line"].split("  #")[0]
    p = start("-c", PLAIN_LOOP, str(ROOT / "examples"), data, call, "3")
    code, out, err = finish(p, 300)
    assert code == 0, err
    plain = float(out.strip().splitlines()[-1])
    lo, hi = chosen["interval"]
    assert lo <= plain <= hi, (
        f"plain loop {plain:.1f} images/s; --tune said {chosen['images_per_sec']:.1f} ({lo:.1f}-{hi:.1f})"
    )


def test_a_tf_data_pipeline_is_tuned_over_the_settings_its_callable_takes(data, tmp_path):
    doc, text = tune(TF_DATA, data, "--target-rate", "1e9", "--loader-workers", "2", "--loader-seconds", "0.5",
                     "--no-stages", json_path=tmp_path / "t.json")  # fmt: skip
    tu = doc["tune"]
    assert tu["kind"] == "tf.data" and tu["not_tried"] == [] and tu["chosen"] is None
    assert [t["setting"] for t in tu["tried"]] == [
        {"num_parallel_calls": n, "prefetch": p, "private_threadpool_size": n} for n in (1, 2) for p in (1, 2)
    ]
    assert all(t["images_per_sec"] > 0 and t["cpu_cores"] > 0 for t in tu["tried"])
    assert tu["shortfall"]["limit"]["slowest_stage"] is None and "--no-stages" in text


def test_a_dataflow_is_tuned_over_its_processes_and_its_line_calls_the_callable(data, tmp_path):
    doc, text = tune(DATAFLOW, data, "--target-rate", "1", "--loader-seconds", "0.5", json_path=tmp_path / "t.json")
    tu = doc["tune"]
    assert tu["kind"] == "dataflow" and [t["setting"] for t in tu["tried"]] == [{"num_proc": 0}]
    assert tu["chosen"]["line"] == f"make_dataflow(data={data!r}, batch_size=4, image_size=32, num_proc=0)"
    assert tu["chosen"]["line"] in text
    # A demand it cannot meet: num_proc 0 and 1 (up to --loader-workers), each measured.
    doc, text = tune(DATAFLOW, data, "--target-rate", "1e9", "--loader-workers", "1", "--loader-seconds", "0.5",
                     "--no-stages", json_path=tmp_path / "t2.json")  # fmt: skip
    assert [t["setting"] for t in doc["tune"]["tried"]] == [{"num_proc": 0}, {"num_proc": 1}]
    assert all(t["images_per_sec"] > 0 for t in doc["tune"]["tried"])


REFUSED = """
import numpy as np
from torch.utils.data import DataLoader

class Fixed(DataLoader):
    def __init__(self, dataset):
        super().__init__(dataset, batch_size=2)

def fixed():
    return Fixed([(np.zeros((8, 8, 3), np.uint8), 0)] * 8)

def plain():
    while True:
        yield np.zeros((2, 8, 8, 3), np.uint8), np.zeros(2, np.int64)
"""


def _refused(*args: str) -> str:
    p = start("bench_input.py", *args)
    code, _, err = finish(p, 120)
    assert code != 0
    lines = error_lines(err)
    assert len(lines) == 1, err[-2000:]
    assert left_in_session(p.pid) == []
    return lines[0]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--tune", "--target-rate", "10"], "--tune: only with --loader-only"),
        (
            ["--loader-only", "--tune"],
            "--tune needs a demand to meet: --emulate NAME --num-devices N, or --target-rate",
        ),
        (["--loader-only", "--tune", "--target-rate", "10", "--epochs", "2"], "--tune and --epochs 2"),
        (["--loader-only", "--tune", "--target-rate", "10", "--emulate", "H100"], "--target-rate and --emulate"),
    ],
)
def test_tune_without_its_companions_is_one_line(data, flags, words):
    assert words in _refused("--loader", TV, "--loader-arg", f"data={data}", *flags)


def test_loaders_with_nothing_to_tune_are_one_line_naming_the_type_and_what_it_needs(data, tmp_path):
    mod = tmp_path / "refused_loaders.py"
    mod.write_text(REFUSED)
    demand = ["--loader-only", "--tune", "--target-rate", "10"]
    line = _refused("--loader", f"{mod}:fixed", *demand)
    assert "returns refused_loaders.Fixed, which --tune cannot make again as Fixed(dataset" in line
    assert "takes torch DataLoader's own arguments" in line
    line = _refused("--loader", f"{mod}:plain", *demand)
    assert "returns builtins.generator (a plain iterable): it has no settings to tune" in line
    line = _refused("--loader", "examples/torchvision_imagefolder.py:make_dataset", "--loader-arg", f"data={data}",
                    *demand)  # fmt: skip
    assert "returns a map-style ImageFolder that feedbench batches itself" in line and "DataLoader over it" in line
