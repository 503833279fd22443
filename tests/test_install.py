"""A non-editable install works on its own: every package and data file ships, and the CLI runs from it.

An editable install (what `make install` does) reads the checkout, so a package missing from setup.py
goes unnoticed there. This test installs a copy of the checkout with `pip install --no-deps
--no-build-isolation --no-index` into a scratch venv whose only link to the project's venv is a .pth
line for the dependencies (the project's own .pth files, the editable install's finder among them, are
not read through it), then runs the installed `feedbench` from a folder outside the checkout and checks
that the code it ran came from the install. No network, and everything lives under tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(900)

# Folders with an __init__.py that are not shipped (setup.py's NOT_SHIPPED); every other one is.
NOT_SHIPPED = {"tests", "examples", "scripts", "docs", "build"}
# What a checkout holds that is not source (.gitignore): left out of the copy that is installed.
NOT_SOURCE_TOP = {".git", ".venv", "build", "results", "data", "tests", ".pytest_cache", ".ruff_cache", ".hypothesis"}
NOT_SOURCE = ("__pycache__", "*.pyc", "*.o", "*.egg-info")
# Built next to the sources on the user's machine, not shipped as files of the checkout.
BUILT = {".so", ".o", ".pyc"}
TORCH_RUN = ["--framework", "torch", "--fake-location", "gpu", "--steps", "1", "--repeats", "1",
             "--warmup-steps", "0", "--batch", "2", "--image-size", "32", "--num-gpus", "1"]  # fmt: skip


def shipped_packages(root: Path) -> list[Path]:
    """The checkout's top-level packages that an install must hold (a new one, like harness/, included)."""
    return sorted(d for d in root.iterdir() if (d / "__init__.py").is_file() and d.name not in NOT_SHIPPED)


def source_files(package: Path) -> list[Path]:
    """Every file of a package folder that the install must hold: modules, subpackages, native sources, data."""
    return sorted(
        f.relative_to(package.parent)
        for f in package.rglob("*")
        if f.is_file() and "__pycache__" not in f.parts and f.suffix not in BUILT
    )


class Install:
    """A scratch venv with feedbench installed into it, and how to run things there."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.venv = base / "venv"
        self.python = self.venv / "bin" / "python"
        self.elsewhere = base / "elsewhere"  # the cwd of every command: not the checkout
        self.tmp = base / "tmp"
        self.elsewhere.mkdir()
        self.tmp.mkdir()
        # No PYTHONPATH (pytest's would put the checkout first); temporary files under tmp_path; no pip cache.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env.update(TMPDIR=str(self.tmp), PIP_NO_CACHE_DIR="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")

    def run(self, *args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(a) for a in args], cwd=self.elsewhere, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def site_packages(self) -> Path:
        out = self.run(self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        assert out.returncode == 0, out.stderr
        return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Install:
    base = tmp_path_factory.mktemp("install")
    # A copy of the checkout: the build writes build/ and *.egg-info next to setup.py, and must not in the
    # checkout. Op libraries already built there come along (copy2 keeps the times the build checks).
    src = base / "src"
    anywhere = shutil.ignore_patterns(*NOT_SOURCE)

    def ignore(folder: str, names: list[str]) -> set[str]:
        return anywhere(folder, names) | (NOT_SOURCE_TOP & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, src, ignore=ignore)
    inst = Install(base)
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(inst.venv)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    # The dependencies (and pip, setuptools) from the project's environment, by path only.
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (inst.site_packages() / "feedbench-deps.pth").write_text("".join(f"{d}\n" for d in deps))
    pip = inst.run(inst.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", src)
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}"
    return inst


def test_every_package_and_its_files_are_installed(installed):
    site = installed.site_packages()
    packages = shipped_packages(ROOT)
    assert {"harness", "consumers", "feeders", "models", "zmq_ops", "core"} <= {p.name for p in packages}
    missing = [str(f) for p in packages for f in source_files(p) if not (site / f).is_file()]
    assert not missing, f"not installed: {missing}"
    assert (site / "bench_input.py").is_file()
    # The TensorFlow op is built at install time, against the installed TensorFlow.
    assert list((site / "zmq_ops").glob("_zmq_ops*.so")), "the zmq_ops op library was not installed"


def test_the_installed_code_is_what_runs(installed):
    code = (
        "import json, bench_input, consumers.declared, models.tf.emulated_op, zmq_ops, runner\n"
        "print(json.dumps([m.__file__ for m in (bench_input, consumers.declared, models.tf.emulated_op,"
        " zmq_ops, runner)]))"
    )
    out = installed.run(installed.python, "-c", code)
    assert out.returncode == 0, out.stderr[-3000:]
    site = installed.site_packages()
    for where in json.loads(out.stdout.strip().splitlines()[-1]):
        assert Path(where).is_relative_to(site), f"{where} is not from the install in {site}"


def test_installed_cli_help(installed):
    feedbench = installed.venv / "bin" / "feedbench"
    for cmd in ([feedbench, "--help"], [installed.python, "-m", "bench_input", "--help"]):
        out = installed.run(*cmd, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "--framework" in out.stdout and "--fake-location" in out.stdout


def test_installed_cli_runs_one_torch_step(installed):
    out_json = installed.elsewhere / "one-step.json"
    run = installed.run(installed.venv / "bin" / "feedbench", *TORCH_RUN, "--json", out_json)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    doc = json.loads(out_json.read_text())
    assert list(doc["paths"]) == ["gpu"]
    assert doc["paths"]["gpu"]["images_per_sec"]["median"] > 0
    # torch keeps its own compile cache there (torchinductor_<user>), as it does in any program that imports it.
    left = [p.name for p in installed.tmp.iterdir() if not p.name.startswith("torchinductor_")]
    assert not left, f"the run left temporary files behind: {left}"
