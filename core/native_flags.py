"""Compiler flags every native library of this project is built with (the op libraries, the receiver, the
ROI JPEG decoder, the cluster tasks' bind shim): they read bytes from other processes and other people's
files, so they get the hardening Debian's gcc leaves off by default, and compile warning-free.

`FEEDBENCH_SANITIZE=1` in the environment builds with AddressSanitizer and UndefinedBehaviorSanitizer
instead of the fortified build (`make fuzz-asan`, scripts/fuzz_native.py). Imported by the build scripts,
which may run before the project is on sys.path: it imports nothing of the project.
"""

from __future__ import annotations

import os

WARNINGS = ["-Wall", "-Wextra"]
HARDENED_COMPILE = ["-fstack-protector-strong", "-D_FORTIFY_SOURCE=2"]
HARDENED_LINK = ["-Wl,-z,relro,-z,now"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-g"]


def sanitized() -> bool:
    """Whether this build is the sanitizers' (FEEDBENCH_SANITIZE=1)."""
    return os.environ.get("FEEDBENCH_SANITIZE", "") == "1"


def compile_flags() -> list[str]:
    """Flags for every compile, after -O2: warnings, and hardening (or the sanitizers)."""
    return [*WARNINGS, *(SANITIZE if sanitized() else HARDENED_COMPILE)]


def link_flags() -> list[str]:
    """Flags for every shared library's link: full RELRO (or the sanitizers' runtime)."""
    return [*HARDENED_LINK, *(SANITIZE if sanitized() else [])]
