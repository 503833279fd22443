"""Set-up says what a user can act on: a pip configuration naming folders this machine lacks gives one line, not a
warning per package; TensorFlow on a machine without an NVIDIA driver says nothing about CUDA, and an error it
raises still shows.

Real pip runs (`--dry-run`: nothing is installed) against a scratch configuration, find-links folder and
index under tmp_path; no network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup_env.sh"
# The line scripts/setup_env.sh runs before its first pip command (checked to be there, below).
QUIET = 'eval "$("$VENV/bin/python" scripts/pip_locations.py)"'


def _wheel(folder: Path) -> None:
    """A tiny installable wheel, `fbdemo` 1.0, for pip to find in a find-links folder."""
    dist = "fbdemo-1.0.dist-info"
    with zipfile.ZipFile(folder / "fbdemo-1.0-py3-none-any.whl", "w") as z:
        z.writestr("fbdemo/__init__.py", "")
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: fbdemo\nVersion: 1.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")


def _pip(tmp_path: Path, quiet: bool) -> subprocess.CompletedProcess:
    """`pip install --dry-run fbdemo` as set-up runs pip, under a configuration naming two missing folders."""
    links, index = tmp_path / "links", tmp_path / "index"
    links.mkdir()
    (index / "fbdemo").mkdir(parents=True)  # an index without files: nothing is looked up over the network
    (index / "fbdemo" / "index.html").write_text("<html><body></body></html>\n")
    _wheel(links)
    conf = tmp_path / "pip.conf"
    conf.write_text(
        f"[global]\nindex-url = file://{index}\nfind-links = {links} {tmp_path}/gone-wheels\n"
        f"extra-index-url = file://{tmp_path}/gone-index/simple\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(conf), VENV=str(Path(sys.executable).parent.parent))
    line = QUIET.replace('"$VENV/bin/python"', f'"{sys.executable}"') + "; " if quiet else ""
    pip = f'"{sys.executable}" -m pip install -q --disable-pip-version-check --dry-run --no-deps --report - fbdemo'
    return subprocess.run(["bash", "-c", f"set -euo pipefail; {line}{pip}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_pip_locations_this_machine_lacks_are_one_line_not_a_warning_each(tmp_path):
    done = _pip(tmp_path, quiet=True)
    assert done.returncode == 0, done.stderr
    assert '"name": "fbdemo"' in done.stdout  # found in the folder that exists: the run still installs
    assert "is ignored" not in done.stderr and "WARNING" not in done.stderr, done.stderr
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("setup: ")]
    assert said == [
        f"setup: pip's configuration names {tmp_path}/gone-wheels, file://{tmp_path}/gone-index/simple, which this "
        "machine does not have: left out of this set-up's pip runs"
    ], done.stderr


def test_without_it_pip_warns_about_each_missing_location(tmp_path):
    """What set-up printed before, a warning per location and package: the line above is what removes it."""
    done = _pip(tmp_path, quiet=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("is ignored") >= 2, done.stderr
    lines = SETUP.read_text().splitlines()
    first_pip = next(i for i, ln in enumerate(lines) if "-m pip" in ln and not ln.lstrip().startswith("#"))
    assert QUIET in lines and lines.index(QUIET) < first_pip


def test_a_configuration_with_every_location_there_is_left_alone(tmp_path):
    (tmp_path / "links").mkdir()
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {tmp_path}/links\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = str(conf)
    done = subprocess.run([sys.executable, "scripts/pip_locations.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done


TF_RUN = """
import sys
from harness.tf import plugin  # TensorFlow imported as a run imports it
from frameworks.tf_env import import_tf

tf = import_tf()
print(len(tf.compat.v1.Session().list_devices()), "devices")
"""


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="a machine with an NVIDIA driver: CUDA is no noise")
def test_tensorflow_without_an_nvidia_driver_says_nothing_about_cuda():
    done = subprocess.run([sys.executable, "-c", TF_RUN], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "devices" in done.stdout, done.stderr
    for noise in ("cuInit", "absl::InitializeLog", "oneDNN custom operations", "is deprecated"):
        assert noise not in done.stderr, done.stderr


FILTERED = """
import os, subprocess, sys
from frameworks.tf_env import NO_DRIVER, INFO, filtered_stderr

with filtered_stderr([*INFO, *NO_DRIVER]):
    os.write(2, b"I0000 00:00:1795830947.947471   22960 port.cc:153] oneDNN custom operations are on.\\n")
    os.write(2, b"E0000 00:00:1795830964.341228   22960 cuda_platform.cc:52] failed call to cuInit: INTERNAL\\n")
    os.write(2, b"E0000 00:00:1795830964.341228   22960 session.cc:1] a real error\\n")
    subprocess.run([sys.executable, "-c", "import sys; print('from a child', file=sys.stderr)"], check=True)
    if sys.argv[1] == "die":
        os.write(2, b"the last words before dying")
        os._exit(3)
print("after the filter", file=sys.stderr)
"""


@pytest.mark.parametrize("how", ["live", "die"])
def test_the_filter_drops_only_the_noise_and_loses_nothing_when_the_process_dies(how):
    done = subprocess.run([sys.executable, "-c", FILTERED, how], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    lines = done.stderr.splitlines()
    assert "E0000 00:00:1795830964.341228   22960 session.cc:1] a real error" in lines, done.stderr
    assert "from a child" in lines
    assert "oneDNN" not in done.stderr and "cuInit" not in done.stderr
    if how == "die":
        assert done.returncode == 3 and lines[-1] == "the last words before dying", done.stderr
    else:
        assert done.returncode == 0 and lines[-1] == "after the filter", done.stderr


def _setup_pip_install() -> str:
    """scripts/setup_env.sh's own `pip_install` function, as its text (run below in a scratch shell)."""
    text = SETUP.read_text()
    start = text.index("pip_install() {")
    return text[start : text.index("\n}\n", start) + 3]


def test_a_local_index_that_lacks_a_package_gives_no_warning_per_package(tmp_path):
    """A file:// index folder that exists but holds no folder for a package: pip warns for each package it
    looks up there (a fresh set-up printed over a hundred such lines); set-up's pip drops them, keeps errors."""
    links, index, other = tmp_path / "links", tmp_path / "index", tmp_path / "other-index"
    links.mkdir()
    other.mkdir()  # there, but without an fbdemo/ folder
    (index / "fbdemo").mkdir(parents=True)
    (index / "fbdemo" / "index.html").write_text("<html><body></body></html>\n")
    _wheel(links)
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = file://{index}\nfind-links = {links}\nextra-index-url = file://{other}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(conf), VENV=str(Path(sys.executable).parent.parent))
    args = "--dry-run --no-deps --report - fbdemo"
    plain = f'"{sys.executable}" -m pip install -q --disable-pip-version-check {args}'
    runs = {
        name: subprocess.run(
            ["bash", "-c", f"set -euo pipefail; {script}"], env=env, capture_output=True, text=True, timeout=120
        )  # fmt: skip
        for name, script in (
            ("setup", f"{_setup_pip_install()}pip_install {args}; pip_install no-such-package-fb || true"),
            ("plain", plain),
        )
    }
    assert runs["plain"].stderr.count("is ignored") >= 1, runs["plain"].stderr  # what set-up printed before
    done = runs["setup"]
    assert done.returncode == 0 and '"name": "fbdemo"' in done.stdout, done.stderr
    assert "is ignored" not in done.stderr, done.stderr
    assert "no-such-package-fb" in done.stderr  # pip's own errors still reach the user
