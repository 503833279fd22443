"""feedbench: a benchmark and profiler for the input pipelines of deep-learning training.

`pip install --no-build-isolation -e .` also builds the zmq_ops TensorFlow op
against the TensorFlow already installed (that is why build isolation is off:
the op must link against the very TensorFlow that will load it).
`pip install --no-build-isolation .` (not editable) installs a copy that runs on its
own (tests/test_install.py checks it); the TF-free receiver and the emulated device's
op are compiled on first use beside the installed sources, as in a checkout.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
TF_VERSION = "2.21.0"

# Every folder with an __init__.py is a package that ships, except these (they run from a checkout only).
NOT_SHIPPED = [f"{top}{sub}" for top in ("tests", "examples", "scripts", "docs", "build") for sub in ("", ".*")]
# Files beside the Python modules that the installed code reads: the native sources it compiles on the
# user's machine (zmq_ops/src, the emulated device's op, runner/native/bind_host.c) and JSON data.
PACKAGE_DATA = ["**/*.c", "**/*.cc", "**/*.h", "**/*.json"]


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def tensorflow_requirements() -> list[str]:
    """TensorFlow and tf_keras, unless a TensorFlow is already installed.

    scripts/setup_env.sh installs it first: the `tensorflow` wheel (CUDA
    kernels; runs without a GPU too), and on a GPU machine into a folder of
    its own with its CUDA 12 libraries, apart from torch's CUDA 13 ones
    (docs/gpu.md). Listing it again here would let pip put a second copy into
    site-packages. `tensorflow` and `tensorflow-cpu` overwrite each other's files.
    """
    if _installed("tensorflow") or _installed("tensorflow-cpu"):
        return []
    return [f"tensorflow=={TF_VERSION}", f"tf_keras=={TF_VERSION}"]


class BuildZmqOps(build_ext):
    """Builds the zmq_ops op library with TensorFlow's own compile and link flags."""

    def build_extension(self, ext: Extension) -> None:
        spec = importlib.util.spec_from_file_location("zmq_ops_build", HERE / "zmq_ops" / "build.py")
        builder = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = builder  # its dataclasses look their module up there
        spec.loader.exec_module(builder)
        built = builder.build()
        target = Path(self.get_ext_fullpath(ext.name))
        if target.resolve() != built.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, target)


setup(
    name="feedbench",
    version="0.1.0",
    description="Benchmark and profiler for the input pipelines that feed deep-learning training",
    python_requires=">=3.11",
    packages=find_packages(exclude=NOT_SHIPPED),
    py_modules=["bench_input"],
    package_data={"": PACKAGE_DATA},
    ext_modules=[Extension("zmq_ops._zmq_ops", sources=[])],
    cmdclass={"build_ext": BuildZmqOps},
    install_requires=[
        *tensorflow_requirements(),
        "tensorpack==0.11",
        "pyzmq>=25",
        "msgpack>=1.0",
        "numpy>=1.26",
        "psutil>=5.9",
        "nvidia-ml-py>=12",  # NVML, NVIDIA's binding: each window's GPU clocks and power (profiler/gpu_state.py)
        "tqdm>=4.66",
        "tabulate>=0.9",
        "matplotlib>=3.8",
        "scikit-image>=0.22",
        "pillow>=10",
        "simplejpeg>=1.7",
        "opencv-python-headless>=4.11",
        # Ray Data for the `ray-data` path (docs/engines.md). TensorFlow brings the tf.data service itself.
        "ray[data]>=2.40",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.6",
            "hypothesis>=6.100",
            "ruff>=0.5",
            "jsonschema>=4.20",
        ],
        # The TF plugin compiles against the installed TensorFlow: install with --no-build-isolation.
        "dali": ["nvidia-dali-cuda120>=2.0", "nvidia-dali-tf-plugin-cuda120>=2.0"],
    },
    entry_points={"console_scripts": ["feedbench=bench_input:main"]},
)
