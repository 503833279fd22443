"""Comparing two runs: a throttled producer is flagged slower beyond noise (exit 1), a re-run is not (exit 0);
results of another machine or configuration are refused naming the difference, a bad file naming the file.

Every result file here was written by a real run of bench_input.py (the TensorFlow trainer against an
emulated device, which costs no host CPU and paces the steps); the unit-level tests edit copies of one.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

# An emulated device at 500 img/s and one producer that outruns it: python-queue keeps up with the baseline.
RUN = ["--model", "emulated", "--emulate-rate", "500", "--batch", "8", "--image-size", "32", "--num-gpus", "1",
       "--fake-location", "python-queue", "--producers", "1"]  # fmt: skip
# 3 windows of 25 steps (0.4 s each) per path, after the warm-up STEADY has: windows of a few steps vary
# by tens of percent when other work on the machine takes the core for a moment.
QUICK = [*RUN, "--warmup-steps", "20", "--steps", "25", "--repeats", "3"]
# The edits below change a path by a factor of 2: OLD's own noise (its windows' spread, its ratio's interval)
# must be well under that for "beyond noise" to be the right reading.
STEADY_ENOUGH = 1.5
# 5 windows of 25 steps (0.4 s each) per path, after a warm-up past what the producer queued while the
# trainer started: intervals of about 94% from the windows (their least to their most), about 11 s a run.
STEADY = [*RUN, "--warmup-steps", "20", "--steps", "25", "--repeats", "5"]


def bench(procs, *args: str, timeout: float = 240) -> tuple[int, str, str]:
    p = procs.start("bench_input.py", *args)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def compare(procs, old: Path | str, new: Path | str) -> tuple[int, str, str]:
    p = procs.start("-m", "profiler.compare", str(old), str(new))
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


def errors(err: str) -> list[str]:
    """The lines a user reads on stderr (TensorFlow's start-up log aside)."""
    return [ln for ln in err.splitlines() if ln.startswith("error")]


def row(out: str, path: str) -> str:
    """The comparison's line of `path` (the last table of the output: bench_input.py prints the run's first)."""
    return [ln for ln in out.splitlines() if ln.startswith(f"{path} ")][-1]


def _widest_spread(doc: dict) -> float:
    """The largest most/least of any path's windows and of its ratio's interval."""
    widest = 1.0
    for r in doc["paths"].values():
        windows = r["images_per_sec"]["repeats"]
        widest = max(widest, max(windows) / min(windows))
        lo, hi = (r.get("uncertainty") or {}).get("ratio") or (1.0, 1.0)
        widest = max(widest, hi / lo) if lo else widest
    return widest


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> Path:
    """A real run's result file (3 windows per path), steady enough for a factor of 2 to be beyond its noise.

    A run that other work on the machine made noisier than that is measured again, at most TIMING_ATTEMPTS
    times; the failure names each run's spread and the load it ran under.
    """
    from conftest import TIMING_ATTEMPTS, MachineLoad, Procs

    out = tmp_path_factory.mktemp("quick") / "old.json"
    runs = []
    for attempt in range(1, TIMING_ATTEMPTS + 1):
        procs = Procs()
        with MachineLoad() as load:
            try:
                code, _, err = bench(procs, *QUICK, "--json", str(out))
            finally:
                procs.cleanup()
        assert code == 0, err[-2000:]
        spread = _widest_spread(json.loads(out.read_text()))
        if spread <= STEADY_ENOUGH:
            return out
        runs.append(f"run {attempt}: windows or ratio interval spread x{spread:.2f}; {load}")
    pytest.fail(f"no run steady enough to compare (x{STEADY_ENOUGH} at most):\n  " + "\n  ".join(runs))


def edited(result: Path, tmp_path: Path, edit) -> Path:
    """A copy of the real result with `edit(doc)` applied, as NEW.json."""
    doc = json.loads(result.read_text())
    edit(doc)
    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc))
    return new


# --- the comparison itself, on a real result file -----------------------------------------------------


def test_a_result_against_itself_is_within_noise_and_exits_0(procs, result):
    code, out, err = compare(procs, result, result)
    assert code == 0, err
    for path in ("gpu", "python-queue"):  # the paths of the `result` run: the baseline and its --fake-location
        assert "within noise" in row(out, path) and "+0.0%" in row(out, path)
    ratio = json.loads(result.read_text())["paths"]["python-queue"]["ratio_to_baseline"]
    assert f"{ratio:.2f} -> {ratio:.2f}" in row(out, "python-queue") and "baseline" in row(out, "gpu")
    assert "exit 0" in out.splitlines()[-1]


def _scaled(doc: dict, path: str, factor: float, ratio_too: bool) -> None:
    """Every figure of `path` `factor` times what the run measured; its ratio to the baseline too, or not."""
    r = doc["paths"][path]
    ips = r["images_per_sec"]
    ips.update({k: ips[k] * factor for k in ("median", "min", "max")}, repeats=[x * factor for x in ips["repeats"]])
    if ratio_too and r.get("ratio_to_baseline"):
        r["ratio_to_baseline"] *= factor
        r["uncertainty"]["ratio"] = [x * factor for x in r["uncertainty"]["ratio"]]


def test_a_path_at_half_its_rate_is_slower_beyond_noise_and_exits_1(procs, result, tmp_path):
    new = edited(result, tmp_path, lambda d: _scaled(d, "python-queue", 0.5, ratio_too=True))
    code, out, err = compare(procs, result, new)
    assert code == 1, out + err
    assert "slower beyond noise" in row(out, "python-queue") and "-50.0%" in row(out, "python-queue")
    assert "within noise" in row(out, "gpu")
    assert out.splitlines()[-1] == "exit 1: slower beyond noise: python-queue"


def test_a_path_at_twice_its_rate_is_faster_beyond_noise_and_exits_0(procs, result, tmp_path):
    new = edited(result, tmp_path, lambda d: _scaled(d, "python-queue", 2.0, ratio_too=True))
    code, out, err = compare(procs, result, new)
    assert code == 0, out + err
    assert "faster beyond noise" in row(out, "python-queue")


def test_every_path_slower_with_the_same_ratio_is_the_machine_not_the_input(procs, result, tmp_path):
    """The baseline slowed as much as the path: the baseline is flagged, the path's ratio did not move."""

    def slower_machine(doc: dict) -> None:
        for path in doc["paths"]:
            _scaled(doc, path, 0.5, ratio_too=False)

    code, out, err = compare(procs, result, edited(result, tmp_path, slower_machine))
    assert code == 1, out + err
    assert "slower beyond noise" in row(out, "gpu")
    assert "within noise" in row(out, "python-queue") and "slower" not in row(out, "python-queue")
    assert any(ln.startswith("python-queue: images/s moved beyond the windows' noise") for ln in out.splitlines())


def test_a_single_window_says_its_noise_is_unknown(procs, result, tmp_path):
    def one_window(doc: dict) -> None:
        ips = doc["paths"]["python-queue"]["images_per_sec"]
        ips["repeats"] = [ips["median"] * 0.5]

    code, out, _ = compare(procs, result, edited(result, tmp_path, one_window))
    assert code == 0 and "noise unknown (one window)" in row(out, "python-queue")


def test_a_path_in_one_file_only_is_listed_not_refused(procs, result, tmp_path):
    new = edited(result, tmp_path, lambda d: d["paths"].pop("python-queue"))
    code, out, err = compare(procs, result, new)
    assert code == 0, err
    assert f"only in {result}: python-queue" in out and "within noise" in row(out, "gpu")
    code, out, _ = compare(procs, new, result)
    assert code == 0 and f"only in {result}: python-queue" in out


def test_versions_host_and_the_loaders_settings_may_differ_and_are_listed(procs, result, tmp_path):
    def upgraded(doc: dict) -> None:
        doc["device"].update(tensorflow="2.99.0", host="ci-runner-7")
        doc["config"]["producer_rate"] = 100.0

    code, out, err = compare(procs, result, edited(result, tmp_path, upgraded))
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("differs, and may:"))
    assert "tensorflow 2.21.0 -> 2.99.0" in line and "-> ci-runner-7" in line and "producer_rate none -> 100" in line


@pytest.mark.parametrize(
    "where, field, value, words",
    [
        ("config", "batch", 16, "batch (8 vs 16): a comparison needs the same configuration"),
        ("config", "image_size", 64, "image_size (32 vs 64)"),
        ("config", "num_gpus", 2, "num_gpus (1 vs 2)"),
        ("config", "producers", 4, "producers (1 vs 4)"),
        ("config", "transport", "shm", "transport (ipc vs shm)"),
        ("config", "wire_format", "zmq_ops", "wire_format (native vs zmq_ops)"),
        ("config", "use_fp16", True, "use_fp16 (off vs on)"),
        ("config", "curve_keys", "keys/", "encryption (--curve-keys) (off vs on)"),
        (None, "framework", "torch", "framework (tf vs torch)"),
        ("model", "images_per_sec", 1000.0, "model (emulated custom at 500.0 img/s vs emulated custom at 1000.0"),
        ("device", "cpu_cores", 64, "cpu_cores (2 vs 64): a comparison needs the same machine"),
        ("device", "gpus", ["NVIDIA H100"], "gpus (none vs NVIDIA H100): a comparison needs the same machine"),
    ],
)
def test_another_configuration_or_machine_is_refused_naming_the_field(
    procs, result, tmp_path, where, field, value, words
):
    def change(doc: dict) -> None:
        (doc[where] if where else doc)[field] = value

    new = edited(result, tmp_path, change)
    code, out, err = compare(procs, result, new)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {result} and {new} differ in {words}"), err


def _sweep(doc: dict) -> dict:
    return {"schema_version": doc["schema_version"], "grid": {"batch": [8]}, "runs": [], "rows": []}


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a feedbench result (no `paths`)"),
        ("sweep", "a sweep's results (--sweep)"),
        ("old schema", "schema_version 1; this feedbench reads 2 and 3"),
        ("no figures", "path python-queue has no images_per_sec.median"),
        ("folder", "a folder, not a result file"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(procs, result, tmp_path, content, words):
    bad = tmp_path / "bad.json"
    doc = json.loads(result.read_text())
    if content == "sweep":
        bad.write_text(json.dumps(_sweep(doc)))
    elif content == "old schema":
        bad.write_text(json.dumps({**doc, "schema_version": 1}))
    elif content == "no figures":
        broken = copy.deepcopy(doc)
        del broken["paths"]["python-queue"]["images_per_sec"]
        bad.write_text(json.dumps(broken))
    elif content == "folder":
        bad.mkdir()
    elif content is not None:
        bad.write_text(content)
    for old, new in ((bad, result), (result, bad)):  # either side
        code, out, err = compare(procs, old, new)
        assert code == 2 and out == ""
        assert err.strip().splitlines() == [err.strip()] and err.startswith(f"error: {bad}: ") and words in err, err


def _set(doc: dict, dotted: str, value) -> None:
    """Set the field `dotted` (paths.python-queue.images_per_sec.repeats) of `doc` to `value`."""
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc.setdefault(key, {})
    doc[last] = value


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("images_per_sec.repeats", "abc", 'paths.python-queue.images_per_sec.repeats: "abc" is not a list'),
        ("images_per_sec.repeats", [1.0, math.inf], "images_per_sec.repeats: [1.0, Infinity] is not a list of finite"),
        ("images_per_sec.median", math.nan, "path python-queue has no images_per_sec.median"),
        ("images_per_sec", [1.0], "path python-queue has no images_per_sec.median"),
        ("ratio_to_baseline", "0.9", 'paths.python-queue.ratio_to_baseline: "0.9" is not a finite ratio'),
        ("ratio_to_baseline", math.nan, "paths.python-queue.ratio_to_baseline: nan is not a finite ratio"),
        ("uncertainty.ratio", [0.9], "paths.python-queue.uncertainty.ratio: [0.9] is not an interval"),
        ("uncertainty", "x", 'paths.python-queue.uncertainty: "x" is not an object'),
        ("telemetry.cpu", [1], "paths.python-queue.telemetry.cpu: [1] is not an object"),
        ("telemetry.input_wait_share", math.inf, "paths.python-queue.telemetry.input_wait_share: inf is not finite"),
    ],
)
def test_a_malformed_figure_is_exit_2_naming_the_file_and_the_field(procs, result, tmp_path, field, value, words):
    """Not exit 1 (which says a path is slower beyond noise) nor a traceback, nor NaN read as within noise."""
    new = edited(result, tmp_path, lambda doc: _set(doc, f"paths.python-queue.{field}", value))
    code, out, err = compare(procs, result, new)
    assert code == 2 and out == "", out + err
    assert err.strip().splitlines() == [err.strip()] and err.startswith(f"error: {new}: ") and words in err, err


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "deep", "huge"])
def test_a_file_that_is_no_result_is_refused_without_waiting_or_reading_it_whole(procs, result, tmp_path, kind):
    """A FIFO (no writer ever comes), a link to /dev/zero (never ends), JSON nested 200,000 deep, a 65 MiB file:
    exit 2 at once, one line naming the file, from profiler.compare and from bench_input.py --compare alike."""
    bad = tmp_path / "bad.json"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "/dev/zero":
        bad.symlink_to("/dev/zero")
    elif kind == "deep":
        bad.write_text("[" * 200_000 + "]" * 200_000)
    else:
        with open(bad, "wb") as f:
            f.truncate(65 * 2**20)  # sparse: no disk used
    words = {"fifo": "not a regular file", "/dev/zero": "not a regular file", "deep": "nested too deep",
             "huge": "over 64 MiB"}[kind]  # fmt: skip
    code, out, err = compare(procs, bad, result)
    assert code == 2 and out == "" and err.strip() == err.strip().splitlines()[0], err
    assert err.startswith(f"error: {bad}: ") and words in err, err
    code, out, err = bench(procs, *RUN, "--compare", str(bad), "--json", str(tmp_path / "new.json"), timeout=120)
    assert code == 2 and "images/s" not in out and len(errors(err)) == 1, err[-2000:]
    assert errors(err)[0].startswith(f"error: {bad}: ") and words in errors(err)[0], err[-2000:]


def test_compare_needs_two_files(procs):
    p = procs.start("-m", "profiler.compare", "only-one.json")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and out == ""
    assert err.strip().splitlines() == ["error: the following arguments are required: NEW.json"]


# --- bench_input.py --compare: refused before anything runs -------------------------------------------


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--compare", "missing.json", "--json", "{new}"], "missing.json: no such file"),
        (["--compare", "{old}"], "--compare needs --json FILE or --out DIR"),
        (["--compare", "{old}", "--json", "{new}", "--batch", "16"], "{old} and this run differ in batch (8 vs 16)"),
        (["--compare", "{old}", "--json", "{new}", "--producers", "2"], "differ in producers (1 vs 2)"),
        (["--compare", "{old}", "--out", "{tmp}", "--find-capacity"], "--compare and --find-capacity"),
    ],
)
def test_bench_input_compare_is_refused_before_the_run(procs, result, tmp_path, extra, words):
    new = tmp_path / "new.json"
    names = {"old": str(result), "new": str(new), "tmp": str(tmp_path / "out")}
    code, out, err = bench(procs, *RUN, *[a.format(**names) for a in extra], timeout=120)
    assert code == 2
    assert errors(err) == [errors(err)[0]] and words.format(**names) in errors(err)[0], err[-2000:]
    assert "images/s" not in out and not new.exists() and not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.parametrize(
    "how", ["--json OLD", "--compare naming a link to --json", "--out holding OLD as results.json"]
)
def test_compare_with_a_file_the_run_writes_is_refused_before_the_run(procs, result, tmp_path, how):
    """OLD would be replaced by the run's own results and the run compared with itself (within noise, exit 0,
    whatever it measured): refused in one line before anything runs, OLD left as it was."""
    folder = tmp_path / "d"
    folder.mkdir()
    old = folder / "results.json" if how.startswith("--out") else tmp_path / "same.json"
    shutil.copy(result, old)
    before = old.read_bytes()
    if how == "--json OLD":
        extra = ["--compare", str(old), "--json", str(old)]
    elif how == "--compare naming a link to --json":
        (tmp_path / "link.json").symlink_to(old)
        extra = ["--compare", str(tmp_path / "link.json"), "--json", str(old)]
    else:
        extra = ["--compare", str(tmp_path / "d" / ".." / "d" / "results.json"), "--out", str(folder)]
    code, out, err = bench(procs, *RUN, *extra, timeout=120)
    assert code == 2, err[-2000:]
    assert errors(err) == [errors(err)[0]] and "which this run writes" in errors(err)[0], err[-2000:]
    assert "images/s" not in out and old.read_bytes() == before  # nothing ran, OLD untouched
    assert sorted(p.name for p in folder.iterdir()) == (["results.json"] if how.startswith("--out") else [])


# --- real runs compared: the rates decide, so these run alone ------------------------------------------
# One test measures OLD and both runs compared with it: a test measured again (tests/conftest.py) measures
# all three again, so an unlucky OLD is never kept.


def steady(procs, tmp_path: Path, name: str, *extra: str) -> tuple[Path, str]:
    """A run long enough for honest intervals (5 windows of 25 steps per path): its file and its output."""
    out = tmp_path / f"{name}.json"
    code, stdout, err = bench(procs, *STEADY, *extra, "--json", str(out))
    assert code in (0, 1), err[-2000:]  # 1: --compare found a path slower beyond noise
    return out, stdout


@pytest.mark.timing
def test_a_rerun_is_not_flagged_and_a_throttled_producer_is_flagged_slower_beyond_noise(procs, tmp_path):
    """OLD against a rerun of its configuration: no path slower beyond noise, exit 0. OLD against the same
    configuration with its producer capped at 200 img/s: python-queue falls to 0.4 of the device, flagged
    slower beyond noise with its input wait, exit 1. Both comparisons read the one OLD: three runs, not four."""
    old, _ = steady(procs, tmp_path, "old")
    again, _ = steady(procs, tmp_path, "again")
    code, out, err = compare(procs, old, again)
    assert code == 0, out + err
    assert out.splitlines()[-1] == "exit 0: no path slower beyond noise"
    assert all("slower beyond noise" not in row(out, path) for path in ("gpu", "python-queue")), out

    new, out = steady(procs, tmp_path, "throttled", "--producer-rate", "200", "--compare", str(old))
    line = row(out, "python-queue")
    assert "slower beyond noise" in line and "input wait" in line, out[-3000:]
    rates = [json.loads(f.read_text())["paths"]["python-queue"]["images_per_sec"]["median"] for f in (old, new)]
    assert rates[1] < rates[0]
    assert "producer_rate none -> 200" in out
    assert out.splitlines()[-1].startswith("exit 1: slower beyond noise: ") and "python-queue" in out.splitlines()[-1]
