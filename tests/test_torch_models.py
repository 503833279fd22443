"""The PyTorch model checks (tests/torch_model_checks.py), in an interpreter without TensorFlow.

torchvision aborts when it is imported into a process that has loaded
TensorFlow first, which this suite's process has; the trainers' own processes
never hold both, so the checks run in a pytest of their own.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("torch")


def test_torchvision_resnet50_as_the_trainer_builds_it():
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/torch_model_checks.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert " passed" in p.stdout and "failed" not in p.stdout
