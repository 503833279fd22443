"""One CUDA per framework in this environment: no file written by two packages, each framework's own cuDNN.

TensorFlow 2.21's CUDA wheels are CUDA 12 (nvidia-cudnn-cu12, nvidia-nccl-cu12,
...), torch 2.14's are CUDA 13 (nvidia-cudnn-cu13, nvidia-nccl-cu13, ...), and
the cuDNN and NCCL wheels of both majors write the same files
(nvidia/cudnn/lib/libcudnn*.so.9, nvidia/nccl/lib/libnccl.so.2): in one
site-packages the last installed wins and uninstalling one deletes the
other's. scripts/setup_env.sh keeps them apart (docs/gpu.md); this checks
the environment the tests run in, from the packages' own RECORD files and
the folders each framework's libraries search (their RUNPATH).
"""

from __future__ import annotations

import collections
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest


def owners() -> dict[str, set[str]]:
    """Every installed file (absolute path) -> the distributions in site-packages whose RECORD lists it.

    Only site-packages: a package may put copies of others on `sys.path` at import (Ray adds its
    `thirdparty_files`, psutil and colorama among them), which are not installed files of this environment.
    """
    found: dict[str, set[str]] = collections.defaultdict(set)
    places = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in importlib.metadata.distributions(path=places):
        name = dist.metadata["Name"]
        for f in dist.files or []:
            s = str(f)
            if s.endswith((".pyc", "__init__.py")) or ".dist-info/" in s or s.startswith(".."):
                continue  # namespace packages' __init__ and caches are shared by design
            found[os.path.realpath(f.locate())].add(name)
    return found


def runpath(library: Path) -> list[Path]:
    """The folders `library` searches for its dependencies, $ORIGIN resolved, in order."""
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    m = re.search(r"R(?:UN)?PATH\)\s+Library r(?:un)?path: \[(.*)\]", out)
    dirs: list[Path] = []
    for part in m.group(1).split(":") if m else []:
        d = Path(os.path.normpath(part.replace("$ORIGIN", str(library.parent))))
        if d not in dirs:
            dirs.append(d)
    return dirs


def cuda_libraries(library: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    """For each library name, the file `library`'s RUNPATH finds first (None when none)."""
    dirs = runpath(library)
    return {n: next((os.path.realpath(d / n) for d in dirs if (d / n).exists()), None) for n in names}


def test_no_file_is_written_by_two_installed_packages():
    shared = {path: names for path, names in owners().items() if len(names) > 1}
    assert not shared, "files that two packages install (the last installed wins):\n" + "\n".join(
        f"{p}: {sorted(n)}" for p, n in sorted(shared.items())[:20]
    )


def check_major(library: Path, runtime: str, suffix: str) -> None:
    """`library` finds the CUDA runtime `runtime`, and cuDNN and NCCL from packages built for it (`suffix`)."""
    libs = cuda_libraries(library, (runtime, "libcudnn.so.9", "libnccl.so.2"))
    if libs.pop(runtime) is None:
        pytest.skip(f"{library.name} finds no {runtime}: its CUDA libraries are not installed here (a CPU machine)")
    who = owners()
    for path in libs.values():
        if path is not None:
            # cuDNN and NCCL keep one soname across CUDA majors: only the package says which build it is.
            builds = [o for o in who.get(path, ()) if re.search(r"-cu\d+$", o)]
            assert builds and all(o.endswith(suffix) for o in builds), (
                f"{library.name} would load {path}, installed by {sorted(who.get(path, []))}: not its CUDA ({suffix})"
            )


def test_tensorflow_finds_cuda_12_libraries_of_its_own():
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        pytest.skip("TensorFlow is not installed")
    framework = Path(spec.origin).parent / "libtensorflow_framework.so.2"
    check_major(framework, "libcudart.so.12", "-cu12")


def test_torch_finds_cuda_libraries_of_its_own_major():
    """CUDA 13 from PyPI; CUDA 12 where setup picked PyTorch's cu126 build for an older driver."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed")
    lib = Path(spec.origin).parent / "lib" / "libtorch_cuda.so"
    if not lib.exists():
        pytest.skip("this torch is a CPU build")
    major = "12" if "+cu12" in importlib.metadata.version("torch") else "13"
    check_major(lib, f"libcudart.so.{major}", f"-cu{major}")


SETUP = Path(__file__).resolve().parent.parent / "scripts" / "setup_env.sh"


@pytest.mark.parametrize(
    "driver, suffix, says",
    [
        ("", "", None),  # no NVIDIA driver (this machine): PyPI's wheel, as ever
        ("590.48.01", "", None),
        ("580.65.06", "", None),
        ("550.54.14", "+cu126", "setup: NVIDIA driver 550.54.14 is older than CUDA 13 needs (580.65.06): torch's "),
        ("470.82.01", "", "setup: NVIDIA driver 470.82.01 is older than any CUDA build of torch 2.14.1 needs"),
    ],
)
def test_setup_picks_the_torch_build_the_driver_can_run(driver, suffix, says):
    p = subprocess.run(["bash", str(SETUP), "--torch-build-for", driver], capture_output=True, text=True, check=True)
    lines = p.stdout.splitlines()
    assert (lines or [""])[0] == suffix
    assert lines[1].startswith(says) if says else len(lines) <= 1, lines
