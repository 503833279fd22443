"""Build the emulated device's op library (EmulatedDeviceStep) against the installed TensorFlow.

Same flags, stamp and incremental rules as the zmq_ops op (zmq_ops/build.py
does the work); runs as `python models/tf/emulated_op/build.py` (`make op`).
"""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent


def _builder():
    """zmq_ops/build.py as a module of its own: importing the zmq_ops package would load TensorFlow."""
    name = "feedbench_native_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "zmq_ops" / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def spec():
    """The library's description for zmq_ops/build.py's builder."""
    b = _builder()
    return b.NativeLibrary(
        label="emulated_device",
        src=HERE,
        library=HERE / ("_emulated_device" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")),
        stamp_mark=b"feedbench-emulated-device-stamp:",
        stamp_define="EMULATED_DEVICE_BUILD_STAMP",
        script=Path(__file__).resolve(),
    )


def build(force: bool = False, verbose: bool = True) -> Path:
    """Build the library if missing or stale; returns its path (raises the builder's BuildError)."""
    return _builder().build_library(spec(), force=force, verbose=verbose)


def main() -> int:
    try:
        path = build(force="--force" in sys.argv[1:], verbose="--quiet" not in sys.argv[1:])
    except _builder().BuildError as e:
        print(f"emulated_device: {e}", file=sys.stderr)
        return 1
    if "--quiet" not in sys.argv[1:]:
        print(f"emulated_device: {path} is up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
