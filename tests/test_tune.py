"""`--loader-only --tune`: the smallest setting of a real loader that meets a demand, or its shortfall and limit.

Real loaders throughout (the examples' torchvision ImageFolder DataLoader,
tf.data pipeline and tensorpack DataFlow) on real JPEGs, each setting in
fresh processes, through `bench_input.py`.
"""

from __future__ import annotations

import ast
import json
import math
import os
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
    doc, text = tune(TV, data, "--target-rate", "1e9", "--loader-workers", "1", "--loader-seconds", "1.5",
                     json_path=tmp_path / "t.json")  # fmt: skip
    tu = doc["tune"]
    assert tu["chosen"] is None
    assert [(t["setting"]["num_workers"], t["setting"]["prefetch_factor"], t["setting"]["persistent_workers"])
            for t in tu["tried"]] == [(0, None, None), (1, 2, False), (1, 2, True), (1, 4, True)]  # fmt: skip
    # A setting whose window timed too few batches says so (a pass of 4 batches restarts its workers).
    measured = [t for t in tu["tried"] if t["images_per_sec"] is not None]
    assert measured and all(t["images_per_sec"] > 0 for t in measured) and not any(t["meets"] for t in tu["tried"])
    assert all(t["not_measured"] in text for t in tu["tried"] if t["images_per_sec"] is None)
    s = tu["shortfall"]
    top = max(measured, key=lambda t: t["images_per_sec"])
    if s["told_apart"]:  # best only where its interval is above every other's
        assert s["best"] == top and all(t["interval"][1] < top["interval"][0] for t in measured if t != top)
    else:  # else the cheapest of those it cannot be told from
        assert s["best"] == next(t for t in measured if t["interval"][1] >= top["interval"][0])
        assert "cannot be told apart" in text and "the cheapest is" in text
    assert s["ratio"] == pytest.approx(s["best"]["images_per_sec"] / 1e9)
    stage = s["limit"]["slowest_stage"]["stage"]
    assert stage in ("read", "decode", "RandomResizedCrop", "RandomHorizontalFlip", "ToUint8HWC")
    assert "x short" in text
    # The cores the demand needs, one figure, from the best setting's images per CPU-second, beside this machine's.
    n, best = s["needs"], s["best"]
    assert n["extrapolated"] and n["extrapolated_from"] == best["setting"] and n["machine_cores"] == os.cpu_count()
    assert n["images_per_sec_per_core"] == pytest.approx(best["images_per_sec"] / best["cpu_cores"])
    assert n["cores_needed"] == math.ceil(1e9 / n["images_per_sec_per_core"]) and n["beyond_this_machine"]
    assert (
        f"about {n['cores_needed']:,} cores (extrapolated from {n['images_per_sec_per_core']:.3g} img/s per core, "
        f"measured with {', '.join(f'{k}={v}' for k, v in best['setting'].items() if v is not None)};"
    ) in text, text
    assert f"this machine has {os.cpu_count()}: more workers than cores cannot speed up a CPU-bound loader" in text
    assert "workers_needed" not in json.dumps(doc)
    if s["limit"]["slowest_stage"]["tied_with"]:  # stages the samples cannot tell apart: named together
        assert f"the limit is one of the stages {stage} (" in text and "a tie" in text, text
    else:
        assert f"the limit is the stage {stage}" in text


def _row(workers: int, rate: float | None, interval: list | None) -> dict:
    return {"setting": {"num_workers": workers}, "images_per_sec": rate, "interval": interval}


def test_a_setting_is_best_only_when_its_interval_is_above_the_others():
    """Overlapping intervals: the settings cannot be told apart and the cheapest of them is named; a setting
    whose interval lies above every other's is the best; a setting without a rate takes no part."""
    from profiler.tune_report import best_of

    tried = [_row(0, 40.0, [38.0, 42.0]), _row(1, None, None), _row(2, 43.3, [37.1, 48.0]), _row(4, 20.0, [19, 21])]
    best, alike = best_of(tried)
    assert best is tried[0] and alike == [tried[0], tried[2]]
    tried[2]["interval"] = [42.5, 48.0]
    best, alike = best_of(tried)
    assert best is tried[2] and alike == [tried[2]]
    assert best_of([_row(0, None, None)]) == (None, [])


def test_a_setting_measured_in_several_processes_holds_its_median_and_meets_only_when_all_measured():
    """The median process's rate lies inside the interval spanning theirs; a process without a rate leaves the
    setting short of "meets", whatever the others measured."""
    from runner.loader_tune import tune_row

    def point(rate, lo, hi):
        return {
            "images_per_sec": rate,
            "not_measured": None,
            "batches": 30,
            "slice_rates": [lo, rate, hi],
            "interval": [lo, hi],
            "interval_confidence": 0.75,
            "cpu_cores": 1.0,
            "rss_mb": 10.0,
            "window_s": 1.0,
        }

    row = tune_row({"num_workers": 2}, [point(50, 45, 52), point(43, 37, 44), point(60, 58, 70)], 40)
    assert row["interval"][0] <= row["images_per_sec"] <= row["interval"][1] and row["meets"]
    lost = {**point(0, 0, 0), "images_per_sec": None, "interval": None, "not_measured": "not measured (2 batches)"}
    row = tune_row({"num_workers": 2}, [point(50, 45, 52), lost, point(60, 58, 70)], 40)
    assert not row["meets"] and row["not_measured"] == "1 of 3 processes not measured"


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
    doc, text = tune(TF_DATA, data, "--target-rate", "1e9", "--loader-workers", "2", "--loader-seconds", "1.5",
                     "--no-stages", json_path=tmp_path / "t.json")  # fmt: skip
    tu = doc["tune"]
    assert tu["kind"] == "tf.data" and tu["not_tried"] == [] and tu["chosen"] is None
    assert [t["setting"] for t in tu["tried"]] == [
        {"num_parallel_calls": n, "prefetch": p, "private_threadpool_size": n} for n in (1, 2) for p in (1, 2)
    ]
    assert all(t["images_per_sec"] > 0 and t["cpu_cores"] > 0 for t in tu["tried"])
    assert tu["shortfall"]["limit"]["slowest_stage"] is None and "--no-stages" in text


def test_a_dataflow_is_tuned_over_its_processes_and_its_line_calls_the_callable(data, tmp_path):
    doc, text = tune(DATAFLOW, data, "--target-rate", "1", "--loader-seconds", "2", json_path=tmp_path / "t.json")
    tu = doc["tune"]
    assert tu["kind"] == "dataflow" and [t["setting"] for t in tu["tried"]] == [{"num_proc": 0}]
    assert tu["chosen"]["line"] == f"make_dataflow(data={data!r}, batch_size=4, image_size=32, num_proc=0)"
    assert tu["chosen"]["line"] in text
    # A demand it cannot meet: num_proc 0 and 1 (up to --loader-workers), each measured.
    doc, text = tune(DATAFLOW, data, "--target-rate", "1e9", "--loader-workers", "1", "--loader-seconds", "1.5",
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


# --- a DataLoader whose workers each yield the whole IterableDataset ---------------------------------------

STREAM = '''
import time

import numpy as np
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

SAMPLES = 512


class Stream(IterableDataset):
    """SAMPLES samples, 2 ms each; `split`: each DataLoader worker takes its share, else every worker all of them."""

    def __init__(self, split):
        self.split = split

    def __iter__(self):
        info = get_worker_info() if self.split else None
        start, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(start, SAMPLES, step):
            time.sleep(0.002)
            yield np.full((8, 8, 3), i % 256, np.uint8), i


def make(num_workers=0, split=False):
    return DataLoader(Stream(split), batch_size=16, num_workers=num_workers)
'''
REPEATED = {"checked": True, "num_workers": 2, "samples_per_epoch": 1024, "single_process": 512}


def _loader_only(tmp_path: Path, *flags: str) -> tuple[dict, str]:
    (tmp_path / "stream_loader.py").write_text(STREAM)
    json_path = tmp_path / "r.json"
    p = start("bench_input.py", "--loader", f"{tmp_path / 'stream_loader.py'}:make", "--loader-only",
              "--no-stages", *flags, "--json", str(json_path))  # fmt: skip
    code, text, err = finish(p, 300)
    assert code == 0, err[-3000:]
    assert left_in_session(p.pid) == []
    return json.loads(json_path.read_text()), text


def test_tune_says_which_settings_repeat_every_sample_of_an_unsplit_iterable_dataset(tmp_path):
    """2 workers over an IterableDataset that does not split itself: 1,024 samples per epoch, 512 distinct; the
    rate counts the copies. Every such setting tried carries the counts and a warning line, and one that meets
    the demand is never printed as the line to paste without that warning; 0 and 1 worker repeat nothing."""
    # One worker gives at most 500 samples/s (2 ms each): 650 needs a second, which only copies them.
    doc, text = _loader_only(tmp_path, "--tune", "--target-rate", "650", "--loader-workers", "2",
                             "--loader-seconds", "0.5")  # fmt: skip
    check_part(doc["tune"], "loader_tune")
    tried = doc["tune"]["tried"]
    assert [t["duplicates"] for t in tried if t["setting"]["num_workers"] < 2] == [None] * 4, tried
    two = [t["duplicates"] for t in tried if t["setting"]["num_workers"] == 2]
    assert two and all(d == REPEATED for d in two), tried
    assert "warning: num_workers=2: an epoch yields 1,024 samples where one process yields 512" in text, text
    chosen = doc["tune"]["chosen"]
    if chosen is not None and chosen["setting"]["num_workers"] == 2:
        assert chosen["duplicates"] == REPEATED
        assert text.index("warning: this setting: an epoch yields 1,024") > text.index(chosen["line"]), text


@pytest.mark.parametrize("split", [False, True])
def test_the_loader_only_sweep_says_when_the_loader_as_given_repeats_samples(tmp_path, split):
    """The sweep's figures of a DataLoader(num_workers=2) over an unsplit IterableDataset count each sample
    twice, and its report says so; the same loader splitting its samples between the workers is not flagged."""
    doc, text = _loader_only(tmp_path, "--loader-arg", "num_workers=2", "--loader-arg", f"split={split}",
                             "--loader-workers", "1", "--loader-seconds", "0.3")  # fmt: skip
    if split:
        assert doc["duplicates"] is None and "an epoch yields" not in text
    else:
        assert doc["duplicates"] == REPEATED
        assert "warning: the loader as given (num_workers=2): an epoch yields 1,024 samples" in text, text


SLOW_GETITEM = '''
import time

import numpy as np
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    """Its cost is its own __getitem__ (5 ms a sample), around two transforms that take next to nothing."""

    def __init__(self):
        self.transform = [lambda x: x, lambda x: x]

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.005)
        image = np.zeros((8, 8, 3), np.uint8)
        for step in self.transform:
            image = step(image)
        return image, i


def make():
    return DataLoader(Slow(), batch_size=8)
'''


def test_when_the_listed_stages_explain_little_the_limit_is_what_they_leave_out(tmp_path):
    """The two transforms are timed and take a fraction of a percent of a sample: the limit named is the time
    outside them (the dataset's own __getitem__), with the share the stages do explain, not `<lambda>#2`."""
    (tmp_path / "slow_getitem.py").write_text(SLOW_GETITEM)
    json_path = tmp_path / "r.json"
    p = start("bench_input.py", "--loader", f"{tmp_path / 'slow_getitem.py'}:make", "--loader-only", "--tune",
              "--target-rate", "1e9", "--loader-workers", "1", "--loader-seconds", "0.3", "--json", str(json_path))  # fmt: skip
    code, text, err = finish(p, 300)
    assert code == 0, err[-3000:]
    doc = json.loads(json_path.read_text())
    check_part(doc["tune"], "loader_tune")
    assert [s["name"] for s in doc["stages"]["stages"]] == ["<lambda>", "<lambda>#2"]
    assert doc["stages"]["shares_sum"] < 0.1, doc["stages"]
    limit = doc["tune"]["shortfall"]["limit"]["slowest_stage"]
    assert limit["stage"] == "the dataset's own code outside the listed stages (its __getitem__ around them)"
    assert limit["share"] > 0.9 and limit["seconds_per_sample"] >= 0.005, limit
    line = next(ln for ln in text.splitlines() if ln.startswith("the limit is"))
    assert line.startswith("the limit is none of the listed stages: they explain "), line
    assert "is the dataset's own code outside the listed stages" in line and "<lambda>" not in line, line
    assert "slowest stage: none of the listed stages: they explain " in text, text
