"""Result files: a target that is not a regular file is refused before anything runs, and a set of files is
written whole or not at all, even when the disk fills up at the end.

Real processes: bench_input.py as a user starts it. A full disk is made with a
file-size limit on the run (RLIMIT_FSIZE: writes beyond it fail with EFBIG,
the same failure, for the run, as ENOSPC on a full disk).
"""

from __future__ import annotations

import json
import math
import os
import resource
import stat
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(240)
QUICK = [
    "--fake-location", "gpu", "--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "16",
    "--warmup-steps", "1", "--steps", "2", "--repeats", "1",
]  # fmt: skip
OUT_FILES = ("results.json", "results.csv", "results.md", "results.png", "timeline.json", "timeline.png")


def run(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, str(ROOT / "bench_input.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
        preexec_fn=limit,
    )


def one_error(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def _symlink(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    return link, "a symlink"


def _fifo(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    return fifo, "a pipe"


def _device(tmp_path):
    node = tmp_path / "null.json"  # a character device like /dev/null, made here so no real one is at risk
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot make a device node here")
    return node, "a device"


@pytest.mark.parametrize("make", [_symlink, _fifo, _device], ids=["symlink", "pipe", "device"])
def test_a_json_target_that_is_not_a_regular_file_is_refused_up_front(tmp_path, make):
    target, kind = make(tmp_path)
    before = os.lstat(target)
    r = run(*QUICK, "--json", str(target))
    assert r.returncode == 2, r.stderr[-3000:]
    line = one_error(r.stderr)
    assert line == f"error: --json {target}: exists and is {kind}, not a regular file; refusing to replace it"
    assert "feedbench:" not in r.stdout, "nothing may run before the places are checked"
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), "the target was replaced"


def test_an_out_file_that_is_a_symlink_is_refused_up_front(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "precious").write_text("keep me")
    (out / "results.csv").symlink_to(tmp_path / "precious")
    r = run(*QUICK, "--out", str(out))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "results.csv exists and is a symlink" in one_error(r.stderr)
    assert "feedbench:" not in r.stdout
    assert (out / "results.csv").is_symlink() and (tmp_path / "precious").read_text() == "keep me"


def test_a_full_disk_at_the_end_leaves_none_of_the_files_and_says_so_in_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    json_path = tmp_path / "r.json"
    # The text files are about 1 KB each, the plot about 40 KB: the limit lets the first ones through.
    r = run(*QUICK, "--out", str(out), "--json", str(json_path), fsize=16 * 1024)
    assert r.returncode == 2, r.stderr[-3000:]
    line = one_error(r.stderr)
    assert line.startswith(f"error: --out {out}: cannot write {out / 'results.png'}: File too large (EFBIG)"), line
    assert line.endswith("; nothing written"), line
    assert sorted(os.listdir(out)) == [], "all of the set or none of it, and no temporary files"
    assert not json_path.exists() or json.loads(json_path.read_text())["paths"], "--json: whole or not at all"


def test_the_whole_set_is_written_when_there_is_room(tmp_path):
    out = tmp_path / "out"
    r = run(*QUICK, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(os.listdir(out)) == sorted(OUT_FILES)


# --- an --out folder that holds something odd: the run's results are still written --------------------------

PLAIN_LOADER = """
import numpy as np


def make():
    while True:
        yield np.zeros((4, 16, 16, 3), np.uint8), np.zeros(4, np.int32)
"""
LOADER_ONLY = ["--loader-only", "--loader-workers", "1", "--loader-seconds", "0.3", "--no-stages"]


def _deep(depth: int = 100_000) -> str:
    return '{"started": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    "earlier",
    ['{"started": 1e300}', '{"started": NaN}', '{"started": -1e17}', _deep()],
    ids=["1e300", "NaN", "-1e17", "100000 deep"],
)
def test_an_earlier_set_with_an_odd_time_or_depth_is_kept_aside_and_the_run_written(tmp_path, earlier):
    """An earlier loader.json and timeline.json whose `started` is no time (or which nests too deep to read):
    both are kept in earlier/ (stamped with their files' time) and the run's own files and --json written."""
    (tmp_path / "plain_loader.py").write_text(PLAIN_LOADER)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("loader.json", "timeline.json"):
        (out / name).write_text(earlier)
    json_path = tmp_path / "r.json"
    r = run(
        "--loader", f"{tmp_path / 'plain_loader.py'}:make", *LOADER_ONLY, "--out", str(out), "--json", str(json_path)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert json.loads(json_path.read_text())["mode"] == "loader-only"
    assert json.loads((out / "loader.json").read_text())["mode"] == "loader-only"
    (kept,) = (out / "earlier").iterdir()
    assert sorted(p.name for p in kept.iterdir()) == ["loader.json", "timeline.json"]
    assert all((kept / n).read_text() == earlier for n in ("loader.json", "timeline.json"))
    assert f"{kept}{os.sep} (the earlier results that were in {out}, kept)" in r.stdout


def test_out_naming_a_dangling_symlink_is_refused_up_front(tmp_path):
    (tmp_path / "plain_loader.py").write_text(PLAIN_LOADER)
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    r = run("--loader", f"{tmp_path / 'plain_loader.py'}:make", *LOADER_ONLY, "--out", str(link))
    assert r.returncode == 2, r.stderr[-3000:]
    assert (
        one_error(r.stderr)
        == f"error: --out {link}: a symlink to {tmp_path / 'gone'}, which does not exist; create that folder first"
    )
    assert "images/s" not in r.stdout and link.is_symlink() and not (tmp_path / "gone").exists()


def test_a_trainer_run_writes_json_first_and_keeps_an_odd_earlier_set(tmp_path):
    """results.json with `started` 1e300 kept aside and the set written; then an --out whose earlier set cannot
    be kept (`earlier` is a file): that one line and exit 2, but --json, written first, holds the run."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"started": 1e300, "paths": {}}')
    json_path = tmp_path / "r.json"
    r = run(*QUICK, "--out", str(out), "--json", str(json_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert math.isfinite(json.loads((out / "results.json").read_text())["started"]) and json_path.exists()
    (kept,) = (out / "earlier").iterdir()
    assert (kept / "results.json").read_text() == '{"started": 1e300, "paths": {}}'
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "results.json").write_text("{}")
    (blocked / "earlier").write_text("a file where the folder of earlier sets goes")
    json_path.unlink()
    r = run(*QUICK, "--out", str(blocked), "--json", str(json_path))
    assert r.returncode == 2 and "cannot keep the earlier results" in one_error(r.stderr), r.stderr[-3000:]
    assert json.loads(json_path.read_text())["paths"]["gpu"]["images_per_sec"]["median"] > 0
