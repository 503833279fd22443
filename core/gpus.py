"""Does this machine have NVIDIA GPUs, whatever the frameworks say? Asked of the driver, not of a framework.

A framework that sees no GPU on a machine that has some (a CPU-only wheel, a
driver too old for the wheel's CUDA, a CUDA library that did not load) would
otherwise run its towers on the host and report host figures as if they
were the machine's. `unseen_gpus` names the cause and the fix in one line.
Neutral: imports neither TensorFlow nor PyTorch, so both trainers use it.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

PROC = Path("/proc/driver/nvidia")
# The oldest Linux driver each CUDA major runs on (minor-version compatibility), from NVIDIA's
# CUDA Toolkit release notes, table "CUDA Toolkit and Minimum Required Driver Version".
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


def nvidia_gpus() -> list[str]:
    """The NVIDIA GPUs the driver reports: `nvidia-smi -L` lines, else /proc/driver/nvidia/gpus entries."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0:
            gpus = [ln.strip() for ln in out.stdout.splitlines() if ln.startswith("GPU ")]
            if gpus:
                return gpus
    try:
        return sorted(p.name for p in (PROC / "gpus").iterdir())
    except OSError:
        return []


def driver_version() -> tuple[int, ...] | None:
    """The loaded NVIDIA kernel driver's version (e.g. (535, 104, 5)), or None when unknown."""
    try:
        text = (PROC / "version").read_text()
    except OSError:
        text = ""
    m = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+(?:\.\d+)+)", text)
    if m is None:
        smi = shutil.which("nvidia-smi")
        if not smi:
            return None
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = re.match(r"\s*(\d+(?:\.\d+)+)", out.stdout) if out.returncode == 0 else None
        if m is None:
            return None
    return tuple(int(x) for x in m.group(1).split("."))


def hidden_by_env() -> str | None:
    """`CUDA_VISIBLE_DEVICES=<value>` when it hides every GPU (empty or -1), a deliberate CPU run."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None and value.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={value!r}"
    return None


def libcuda_loads() -> bool:
    """The NVIDIA driver's user-space library loads: without it no framework can see a GPU here."""
    return _libcuda_error() is None


def _libcuda_error() -> str | None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return str(e)
    return None


def _version(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


def unseen_gpus(
    framework: str, seen: int, cuda_build: str | None, fix_wheel: str, fix_driver: str | None = None
) -> str | None:
    """Why `framework` sees `seen` == 0 GPUs on a machine that has some, with the fix; None if nothing is wrong.

    `cuda_build` is the CUDA version the framework was built with ("12.5.1"),
    None for a CPU-only build; `fix_wheel` says how to install the CUDA build;
    `fix_driver`, how to get a build for an older driver (else: update the driver).
    A machine without NVIDIA GPUs, a framework that sees them, and GPUs hidden
    on purpose with CUDA_VISIBLE_DEVICES are not errors.
    """
    if seen > 0 or hidden_by_env():
        return None
    gpus = nvidia_gpus()
    if not gpus:
        return None
    has = f"this machine has {len(gpus)} NVIDIA GPU(s) but {framework} sees none"
    if not cuda_build:
        return f"{has}: {framework} here is a CPU-only build; {fix_wheel}"
    major = int(cuda_build.split(".")[0])
    driver = driver_version()
    need = MIN_DRIVER.get(major)
    if driver is not None and need is not None and driver < need:
        return (
            f"{has}: NVIDIA driver {_version(driver)} is too old for {framework}'s CUDA {cuda_build} build "
            f"(it needs {_version(need)} or newer); update the driver" + (f", or {fix_driver}" if fix_driver else "")
        )
    libcuda = _libcuda_error()
    if libcuda is not None:
        return f"{has}: the driver's libcuda.so.1 does not load ({libcuda}); install the NVIDIA driver's user-space libraries"
    return f"{has}: its CUDA {cuda_build} libraries did not load; {fix_wheel}"
