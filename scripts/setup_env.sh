#!/usr/bin/env bash
# Installs what feedbench needs, into .venv/ at the repo root. Safe to run again:
# each step is skipped or is a no-op when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv

# System packages: libzmq headers for the op, a C++ compiler, venv support.
missing=()
[ -f /usr/include/zmq.h ] || missing+=(libzmq3-dev)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
"$PYTHON" -c "import ensurepip, venv" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "feedbench needs Python 3.11 or newer"'
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip setuptools wheel

# One TensorFlow wheel only: tensorflow-cpu without a GPU, tensorflow[and-cuda] with one.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
   && ! "$VENV/bin/python" -m pip show -q tensorflow-cpu >/dev/null 2>&1; then
  "${pip[@]}" "tensorflow[and-cuda]==2.21.0" "tf_keras==2.21.0"
else
  "${pip[@]}" "tensorflow-cpu==2.21.0"
  # tf_keras names `tensorflow` as its dependency; it would pull the second wheel.
  "${pip[@]}" --no-deps "tf_keras==2.21.0"
fi

# PyTorch beside TensorFlow, for `bench_input.py --framework torch` (the same wheels run on CPU and CUDA);
# SPDL for the `spdl` reference loader. Skipped when these versions are already there: pip would
# otherwise put back what a CPU machine removes below.
have() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
if ! { have torch 2.14.1 && have torchvision 0.29.1 && have spdl 0.8.0; }; then
  "${pip[@]}" "torch==2.14.1" "torchvision==0.29.1" "spdl==0.8.0"
  # PyPI's Linux torch wheels are CUDA builds: libtorch links CUDA's runtime, cuDNN and NCCL, so those
  # stay even without a GPU. Triton (about 0.9 GB) only compiles GPU kernels: a CPU machine drops it.
  if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
    "$VENV/bin/python" -m pip uninstall -y -q triton
  fi
fi

# The project itself (editable) with its test and DALI extras; this builds the zmq_ops op.
"${pip[@]}" --no-build-isolation -e ".[test,dali]"
echo "setup: ready ($VENV)"
