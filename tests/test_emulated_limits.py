"""Emulated rates at the edges: a capacity is never more than a probe delivered, a rate whose step would outlast
the run is refused up front, and rates are printed as people read them.

Real processes: bench_input.py as a user starts it, on the cpu path (no producers) with small images.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from core.emulate import rate_text
from tests.conftest import ROOT
from tests.test_uncertainty import agrees_with_its_probes

pytestmark = pytest.mark.timeout(400)


def bench(*args: str, timeout: float) -> subprocess.CompletedProcess:
    p = subprocess.Popen(
        [sys.executable, str(ROOT / "bench_input.py"), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise AssertionError(f"bench_input.py {' '.join(args)} did not finish within {timeout} s") from None
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_a_capacity_never_exceeds_what_a_probe_delivered(tmp_path):
    """A demand no machine meets (1e12 img/s): the capacity is at most what a probe delivered, and printed
    readably. Three probes and one extra try per decisive probe (not 5 and 3) still bisect and repeat a probe,
    where a capacity above what was delivered could come from."""
    out = tmp_path / "r.json"
    r = bench(
        "--find-capacity", "--emulate-rate", "1e12", "--fake-location", "cpu", "--num-gpus", "1",
        "--image-size", "16", "--batch", "8", "--capacity-probes", "3", "--capacity-tries", "1", "--json", str(out),
        timeout=360,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    cap = json.loads(out.read_text())["capacity"]["cpu"]
    delivered = max(p["images_per_sec"] for p in cap["probes"])
    assert cap["images_per_sec"] is None or cap["images_per_sec"] <= delivered, (cap["images_per_sec"], delivered)
    assert agrees_with_its_probes(cap, 1) == [], cap["probes"]
    assert "each capacity is at most what its probes delivered" in r.stdout
    # Rates are printed readably: thousands separated, no 12-digit runs, in the search and its table.
    out_lines = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(out_lines) if "capacity img/s" in ln)
    table = out_lines[head + 2 : head + 4]  # the gpu and cpu rows
    lines = [ln for ln in out_lines if "demand" in ln or "baseline at" in ln] + table
    assert len(lines) >= 3, r.stdout[-3000:]
    assert not [ln for ln in lines if re.search(r"\d{5,}", ln)], lines
    assert "(1,000,000,000,000 img/s per device)" in r.stdout


def _rate_args(rate: str, batch: str | None) -> list[str]:
    """A single run's flags at `rate`, on the gpu path with small images."""
    size = ["--fake-location", "gpu", "--image-size", "16"]
    return ["--emulate-rate", rate, *size, *(["--batch", batch] if batch else [])]


def test_a_rate_whose_step_would_outlast_the_run_is_refused_up_front():
    """bench_input.py as a user starts it: exit 2, one line, no traceback, no run. The other variant (a batch
    given) is refused by the same check, before anything runs: its words are checked in-process below."""
    r = bench(*_rate_args("1e-9", None), timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: --emulate-rate 1e-09: one step of 8 images at "), lines[0]
    assert "longer than the run waits for anything (--recv-timeout 60 s); give at least 0.1333 img/s" in lines[0]
    assert "feedbench:" not in r.stdout and "capacity:" not in r.stdout


@pytest.mark.parametrize("rate,batch", [("1e-9", None), ("0.01", "8")])
def test_each_rate_whose_step_would_outlast_the_run_is_refused_with_its_words(rate, batch):
    """The words main() prints as the one line, from the CLI's own checks (bench_input._main), which refuse
    before any trainer is loaded."""
    from bench_input import _main
    from core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _main(_rate_args(rate, batch))
    words = str(e.value)
    assert words.startswith(f"--emulate-rate {float(rate):g}: one step of 8 images at "), words
    assert "longer than the run waits for anything (--recv-timeout 60 s); give at least 0.1333 img/s" in words


def test_rate_text_reads_like_a_number():
    assert rate_text(97_361_705_223.4) == "97,361,705,223"
    assert rate_text(7000) == "7,000"
    assert rate_text(12.5) == "12.5"
    assert rate_text(1e-9) == "1.00e-09"


def test_a_swept_rate_whose_step_would_outlast_the_run_is_refused_up_front():
    r = bench("--sweep", "--emulate-rate", "500,1e-9", "--fake-location", "gpu", "--image-size", "16", timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(lines) == 1 and lines[0].startswith("error: --emulate-rate 1e-09: one step of 8 images"), lines
    assert "sweep" not in r.stdout
