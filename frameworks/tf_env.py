"""Import TensorFlow the way tensorpack 0.11 needs it on TensorFlow 2.21, and without its start-up noise.

tensorpack uses the Keras 2 layers (tf_keras) and v1 graph-mode APIs, so
TF_USE_LEGACY_KERAS must be set before TensorFlow is first imported and v2
behaviour turned off before any graph is built. Every module that builds a
graph imports TensorFlow through `import_tf()` so the order is always right,
with one idiom at the top of the module:

    from frameworks.tf_env import import_tf

    tf = import_tf()

Start-up noise: TensorFlow logs its INFO lines before its logging reads
TF_CPP_MIN_LOG_LEVEL ("All log messages before absl::InitializeLog() is
called are written to STDERR"), and on a machine without an NVIDIA driver
its first look for GPUs logs "failed call to cuInit: ... UNKNOWN ERROR
(303)" as an error, though running on the CPU is all that can happen
there. `import_tf` imports TensorFlow and takes that first look with
stderr passed through a filter process that drops exactly those lines
(`noise`); every other line, an error included, goes through, and a
separate process drains it even if this one dies meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

# Set on import of this module, which every package that builds graphs imports from its
# __init__, so they hold even when tensorpack (which imports TensorFlow) is imported first.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_tf: ModuleType | None = None

# A line of absl's INFO log ("I0000 00:00:1795830947.947471   22960 port.cc:153] ..."), the line that says the
# level is not read yet, and the second line of the CPU-features INFO message.
INFO = (r"^I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] ", r"^WARNING: All log messages before absl::InitializeLog\(\)",
        r"^To enable the following instructions: .* rebuild TensorFlow")  # fmt: skip
NO_DRIVER = (r"\] failed call to cuInit: ",)  # TensorFlow's first look for GPUs, where no NVIDIA driver is

# The filter: stdin to stdout line by line, less the lines any pattern (argv) matches.
_FILTER = """
import os, re, sys
drop = [re.compile(p.encode()) for p in sys.argv[1:]]
buf = b""
while chunk := os.read(0, 65536):
    *lines, buf = (buf + chunk).split(b"\\n")
    out = b"".join(ln + b"\\n" for ln in lines if not any(d.search(ln) for d in drop))
    if out:
        os.write(1, out)
if buf and not any(d.search(buf) for d in drop):
    os.write(1, buf)
"""


def noise() -> list[str]:
    """The patterns of TensorFlow's start-up lines no user can act on here (see the module's docstring)."""
    out = list(INFO) if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") not in ("", "0") else []
    if not os.path.exists("/proc/driver/nvidia"):  # no NVIDIA kernel driver: the CPU is all there is
        out += NO_DRIVER
    return out


@contextlib.contextmanager
def filtered_stderr(patterns: list[str]) -> Iterator[None]:
    """File descriptor 2, this process's and its children's, through a filter process dropping `patterns`."""
    if not patterns:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        filt = subprocess.Popen([sys.executable, "-I", "-S", "-c", _FILTER, *patterns], stdin=subprocess.PIPE,
                                stdout=saved, stderr=saved)  # fmt: skip
    except OSError:  # no filter: the lines go through as they are
        os.close(saved)
        yield
        return
    os.dup2(filt.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        filt.stdin.close()
        filt.wait()


def import_tf() -> ModuleType:
    """TensorFlow in v1-compatible graph mode (imported once, quietly)."""
    global _tf
    if _tf is None:
        patterns = noise()
        with filtered_stderr(patterns):
            import tensorflow

            if NO_DRIVER[0] in patterns:  # TensorFlow's first look for GPUs, under the filter
                tensorflow.config.list_physical_devices("GPU")
        logger = tensorflow.get_logger()
        level = logger.level
        logger.setLevel("ERROR")  # its deprecation notices are about this call, not the user's code
        try:
            tensorflow.compat.v1.disable_v2_behavior()
        finally:
            logger.setLevel(level)
        _tf = tensorflow
    return _tf
