"""A command line or configuration that cannot work is refused before anything runs, in one line naming the flag.

Output places that cannot be written, seconds that are not a finite number above zero, an image size or batch no
machine can hold (both trainers), bad flags of `--loader-only`: each is run through the real command line, and the
test checks the one `error:` line, the exit code, and that no producer, rank or file was started or written.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from failing_runs import SMALL, needs_torch, one_error, one_error_line, run_folders, start
from test_loader import error_lines, finish

pytestmark = pytest.mark.timeout(240)


def places(tmp_path) -> list[tuple[list[str], str]]:
    a_file = tmp_path / "plain"
    a_file.write_text("")
    cases = [
        (["--json", str(tmp_path)], "is a folder"),
        (["--json", str(tmp_path / "missing" / "r.json")], "no such folder"),
        (["--out", str(a_file)], "not a folder"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        cases.append((["--json", str(ro / "r.json")], "cannot write"))
    return cases


def test_output_places_that_cannot_be_written_are_refused_up_front(procs, tmp_path):
    for args, words in places(tmp_path):
        p = start(procs, tmp_path, *SMALL, *args)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, (args, err)
        line = one_error(err)
        assert args[0] in line and words in line, line
        assert "feedbench:" not in out, "nothing may start before the places are checked"


@pytest.mark.parametrize(
    "flag, value",
    [("--recv-timeout", v) for v in ("0", "-1", "nan", "inf")] + [("--probe-warmup", "0"), ("--probe-window", "-1")],
)
def test_seconds_must_be_a_finite_number_above_zero(procs, tmp_path, flag, value):
    p = start(procs, tmp_path, *SMALL, flag, value)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert flag in one_error(err) and "finite number above 0" in err


def test_an_image_size_no_machine_can_hold_is_refused_saying_why(procs, tmp_path):
    p = start(procs, tmp_path, *SMALL, "--image-size", "200000")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    line = one_error(err)
    assert "--image-size 200000" in line and "GB available" in line
    assert "feedbench:" not in out


REFUSED = {
    "deep literal": (["--loader", f"{ROOT}/examples/torchvision_imagefolder.py:make_loader", "--loader-only",
                      "--loader-arg", "x=" + "[" * 3000 + "]" * 3000], "--loader-arg x: nested 3000 deep"),
    "long literal": (["--loader", f"{ROOT}/examples/torchvision_imagefolder.py:make_loader", "--loader-only",
                      "--loader-arg", "x=" + "1" * 60_000], "--loader-arg x: 60000 characters"),
    "nested literal": (["--loader", f"{ROOT}/examples/torchvision_imagefolder.py:make_loader", "--loader-only",
                        "--loader-arg", "x=" + "(" * 40 + ")" * 40], "--loader-arg x: nested 40 deep"),
    "nan rate": (["--sweep", "--emulate-rate", "nan,5", "--fake-location", "gpu"],
                 "--emulate-rate nan,5: every rate must be a finite number above 0"),
    "inf rate": (["--sweep", "--emulate-rate", "inf,5", "--fake-location", "gpu"],
                 "--emulate-rate inf,5: every rate must be a finite number above 0"),
    "negative batch list": (["--sweep", "--batch", "-2,2", "--fake-location", "gpu"],
                            "argument --batch: expected one argument"),
    "profile onto a file": (["--profile", "{file}", "--fake-location", "gpu"], "exists and is not a folder"),
    "json to stdout": (["--json", "-", "--fake-location", "gpu"], "--json '-': give the name"),
    "empty json": (["--json", "", "--fake-location", "gpu"], "--json '': give the name"),
}  # fmt: skip


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_flag_is_refused_in_one_line_before_anything_runs(tmp_path, case):
    args, words = REFUSED[case]
    (tmp_path / "file").write_text("")
    args = [a.replace("{file}", str(tmp_path / "file")) for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, str(ROOT / "bench_input.py"), *args], cwd=tmp_path, env=env,
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    code, _, err = finish(p, 120)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err and "usage:" not in err, err[-2000:]
    [line] = error_lines(err)
    assert words in line, line
    assert not (tmp_path / "-").exists()


@pytest.mark.timeout(400)
@needs_torch
def test_a_batch_that_cannot_fit_in_memory_is_refused_before_anything_starts(procs, tmpdir_env):
    """ResNet-50 at batch 20000 of 64x64 needs about 200 GB of activations per rank; the batches alone fit."""
    tmp, env = tmpdir_env
    run = procs.start("bench_input.py", "--framework", "torch", "--num-gpus", "2", "--fake-location", "python-queue",
                      "--batch", "20000", "--image-size", "64", env=env)  # fmt: skip
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = one_error_line(err)
    assert line.startswith("error: --batch 20000 at --image-size 64: 2 rank(s) need about "), line
    assert "GB of memory (activations 204.8 GB per rank)" in line and "GB available" in line, line
    assert "feedbench (PyTorch" not in out, "the run did not start"
    assert not run_folders(tmp)


@pytest.mark.timeout(400)
@needs_torch
def test_the_estimate_grows_with_batch_and_pixels_and_fits_small_runs():
    from runner import memory

    small = memory.estimate(4, 64, 2, 0)
    assert memory.check(small, 8e9, None, "x", 2) is None
    big = memory.estimate(400, 64, 2, 0)
    assert big.activations == pytest.approx(100 * small.activations)
    assert memory.estimate(4, 128, 2, 0).activations == pytest.approx(4 * small.activations)
    gpu = memory.estimate(2048, 224, 1, 1)
    line = memory.check(gpu, 1e12, 80e9, "--batch 2048 at --image-size 224", 1)
    assert line and "on its GPU" in line and "80.0 GB" in line
