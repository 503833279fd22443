"""The rule for tests that compare rates: never beside other tests, and retried with the load named.

Runs pytest itself on a small test module, in a fresh process, with this suite's conftest.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODULE = """
import pytest

ATTEMPTS = []

@pytest.mark.timing
def test_fails_every_time():
    assert 1 > 2, "the path ran at 1 img/s, the baseline at 2"

@pytest.mark.timing
def test_passes_at_the_second_attempt(tmp_path):
    ATTEMPTS.append(1)
    assert len(ATTEMPTS) >= 2, "not yet"

def test_an_ordinary_test():
    assert True
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "suite"
    folder.mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "conftest.py", folder / "conftest.py")
    (folder / "test_rates.py").write_text(MODULE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", str(folder), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_timing_test_is_retried_and_its_failure_names_each_attempts_load(tmp_path):
    p = _pytest(tmp_path, "-n0")
    out = p.stdout
    assert p.returncode == 1, out
    assert "1 failed, 2 passed" in out, out
    assert "the comparison failed 3 times" in out and "attempt 3: the path ran at 1 img/s" in out, out
    assert "other work on the machine used" in out, out


def test_a_timing_test_is_not_run_beside_other_tests(tmp_path):
    p = _pytest(tmp_path, "-n", "2")
    assert p.returncode == 0, p.stdout
    assert "1 passed, 2 skipped" in p.stdout and "compares rates: runs only alone" in p.stdout, p.stdout
    p = _pytest(tmp_path, "-n", "2", "-m", "timing")
    assert "2 skipped" in p.stdout, p.stdout
