"""Adding an input path is one folder and nothing else: a path made here, in a temporary folder, runs through
the real command line of both trainers, with a result field of its own.

The folder is `<tmp>/consumers/constant_in_graph/`, as docs/layout.md's recipe
writes a path: its declaration (`path.py`, with the field it adds and how
ranks merge it), a TensorFlow half (`tf.py`) and a PyTorch half (`torch.py`).
No project file knows it: the run finds it because `<tmp>` is on PYTHONPATH
(consumers/__init__.py takes in every `consumers/` folder there). Each run
goes end to end (flags, the gpu baseline, the new path, its own stage and
field, the verdict, the JSON), the PyTorch one on two ranks (torchrun, gloo),
and its JSON is checked against the results schema with the path's field in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAME = "constant-in-graph"
FIELD = "constant_bytes"
ADVICE = "nothing to speed up: the batch is a constant"
SUMMARY = "one random batch held as constants on each device (a path made outside the project)"
SIZE, BATCH = 32, 2
SMALL = ["--input-only", "--num-gpus", "2", "--batch", str(BATCH), "--image-size", str(SIZE), "--warmup-steps", "1",
         "--steps", "3", "--repeats", "2"]  # fmt: skip

PATH_PY = f'''"""`{NAME}`: a constant batch on each device, declared outside the project."""

from core.registry import Declaration
from core.result_fields import ResultField, summed

# Bytes of the constant batches the path holds on the devices: each rank's, added up.
CONSTANT_BYTES = ResultField("{FIELD}", {{"type": "integer", "minimum": 1}}, summed)

PATH = Declaration(
    name="{NAME}",
    summary="{SUMMARY}",
    order=99,
    in_default_run=False,
    advice="{ADVICE}",
    fields=(CONSTANT_BYTES,),
)
'''

TF_PY = '''"""The TensorFlow half: the batch as graph constants, with a stage of its own."""

from tensorpack.input_source import InputSource, TensorInput

from consumers.constant_in_graph.path import PATH
from consumers.tf_half import TFInputPath, random_batch
from core.registry import register
from frameworks.tf_env import import_tf

tf = import_tf()


class CountingStage:
    """A stage of the path's own: it counts the measured steps it was sampled in."""

    name = "constant"
    input_op_types = frozenset()

    def __init__(self) -> None:
        self.samples = []

    def fetches(self):
        return tf.constant(7)

    def record(self, value) -> None:
        self.samples.append(int(value))

    def figures(self) -> dict:
        return {"samples": len(self.samples), "value": self.samples[-1] if self.samples else None}

    def live(self) -> str:
        return ""


@register
class ConstantInGraph(TFInputPath):
    declaration = PATH

    def input_source(self, specs, has_gpu):
        arrays = random_batch(specs, seed=1)
        self.stage = CountingStage()
        self.held = 0

        def tower():  # called once per tower
            self.held += sum(a.nbytes for a in arrays)
            return [tf.constant(a) for a in arrays]

        return TensorInput(tower)

    def sampled_stages(self):
        return [self.stage, *super().sampled_stages()]

    def result_fields(self):
        return {"constant_bytes": self.held}
'''

TORCH_PY = '''"""The PyTorch half: one constant batch made on each rank's device."""

import torch

from consumers.constant_in_graph.path import PATH
from consumers.torch_half import TorchInputPath
from core.registry import register


@register
class ConstantInGraph(TorchInputPath):
    declaration = PATH

    def open(self, ctx):
        super().open(ctx)
        b, s = self.cfg.batch, self.cfg.image_size
        self.images = torch.randint(0, 256, (b, s, s, 3), dtype=torch.uint8, device=ctx.device)
        self.labels = torch.randint(0, 1000, (b,), dtype=torch.int64, device=ctx.device)

    def next(self):
        return self.images, self.labels

    def result_fields(self):
        return {"constant_bytes": self.images.nbytes + self.labels.nbytes}
'''


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """A place outside the project holding the new path's folder, and nothing else."""
    root = tmp_path_factory.mktemp("elsewhere")
    folder = root / "consumers" / "constant_in_graph"
    folder.mkdir(parents=True)
    for name, text in {"__init__.py": "", "path.py": PATH_PY, "tf.py": TF_PY, "torch.py": TORCH_PY}.items():
        (folder / name).write_text(text)
    return root


def run(place: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(place), str(ROOT)])}
    return subprocess.run([sys.executable, str(ROOT / "bench_input.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def schema_errors(place: Path, doc: dict) -> str:
    """What the results schema (the file, with every declared path's fields) says of `doc`; "" when it matches."""
    code = (
        "import json, sys\n"
        "from schema import check_report\n"
        "try:\n"
        "    check_report(json.load(sys.stdin))\n"
        "except AssertionError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(place), str(ROOT), str(ROOT / "tests")])}
    p = subprocess.run([sys.executable, "-c", code], input=json.dumps(doc), cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


@pytest.fixture(scope="module", params=["tf", "torch"])
def new_path_run(request, place, tmp_path_factory) -> tuple[str, dict, str]:
    """(framework, JSON, stdout) of the baseline and the new path, run by `bench_input.py` itself."""
    out = tmp_path_factory.mktemp(f"run-{request.param}") / "r.json"
    p = run(place, "--framework", request.param, "--fake-location", NAME, *SMALL, "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    return request.param, json.loads(out.read_text()), p.stdout


def test_a_path_from_a_folder_outside_the_project_runs_through_the_cli(new_path_run):
    framework, doc, stdout = new_path_run
    assert f"{NAME}: " in stdout  # its verdict line
    assert doc["framework"] == framework and list(doc["paths"]) == ["gpu", NAME]
    r = doc["paths"][NAME]
    sched = r["schedule"]
    assert sched["timed_windows"] == 2 and sched["timed_steps_per_window"] == 3
    assert r["images_per_sec"]["median"] > 0
    assert r["ratio_to_baseline"] == pytest.approx(
        r["images_per_sec"]["median"] / doc["paths"]["gpu"]["images_per_sec"]["median"]
    )
    assert r["input"]["advice"] == ADVICE and r["input"]["summary"] == SUMMARY
    # "none": two short windows may not tell it from the baseline (profiler/uncertainty.py).
    assert r["verdict"]["limiting_stage"] in {"trainer", "input", "none", "unexplained"}
    if framework == "tf":
        tel = r["telemetry"]
        assert tel["constant"]["value"] == 7 and tel["constant"]["samples"] >= 2  # its own stage, sampled per window
        assert tel["staging"]["towers"] == 2  # staged onto each of the two devices
    else:
        assert [rank["rank"] for rank in r["ranks"]] == [0, 1]


def test_the_paths_own_field_reaches_the_json_merged_over_the_ranks(new_path_run):
    framework, doc, _ = new_path_run
    images, labels = BATCH * SIZE * SIZE * 3, BATCH * (8 if framework == "torch" else 4)  # int64 / int32 labels
    # Two devices: TensorFlow's two towers in one process, or PyTorch's two ranks added up by the declared merge.
    assert doc["paths"][NAME][FIELD] == 2 * (images + labels)
    assert FIELD not in doc["paths"]["gpu"]


def test_the_json_with_the_paths_field_matches_the_schema_and_a_misspelt_field_does_not(place, new_path_run):
    _, doc, _ = new_path_run
    assert schema_errors(place, doc) == ""
    doc["paths"][NAME]["constant_byte"] = doc["paths"][NAME].pop(FIELD)
    assert "constant_byte" in schema_errors(place, doc)  # additionalProperties: false still catches a typo


def test_the_new_path_is_listed_by_the_cli_help(place):
    for framework in ("tf", "torch"):
        p = run(place, "--framework", framework, "--help", timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        assert NAME in p.stdout and SUMMARY in " ".join(p.stdout.split())


def test_an_undeclared_field_is_refused_when_ranks_merge(place):
    """A field the path makes but its declaration does not list is named, not dropped."""
    from core.result_fields import ResultField, merge_path_fields, summed

    fields = {FIELD: ResultField(FIELD, {"type": "integer"}, summed)}
    ranks = [{"rank": r, "path_fields": {FIELD: 3, "stray": 1}} for r in (0, 1)]
    with pytest.raises(ValueError, match=f"{NAME}: result field\\(s\\) stray not declared"):
        merge_path_fields(fields, ranks, NAME)
    assert merge_path_fields(fields, [{"rank": r, "path_fields": {FIELD: 3}} for r in (0, 1)], NAME) == {FIELD: 6}
