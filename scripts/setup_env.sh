#!/usr/bin/env bash
# Installs what feedbench needs, into .venv/ at the repo root. Safe to run again:
# each step is skipped or is a no-op when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH=2.14.1
TORCHVISION=0.29.1

# torch's build for the NVIDIA driver: PyPI's wheels are CUDA 13 (driver 580.65.06 or newer); an older
# driver (525.60.13 or newer) gets PyTorch's CUDA 12.6 build from download.pytorch.org, where it has one.
# `setup_env.sh --torch-build-for DRIVER` prints the choice (version suffix, then the line saying why).
older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
torch_build_for() {
  local driver=$1
  if [ -z "$driver" ] || ! older "$driver" 580.65.06; then
    echo ""
  elif older "$driver" 525.60.13; then
    echo ""
    echo "setup: NVIDIA driver $driver is older than any CUDA build of torch $TORCH needs (525.60.13): torch will not see the GPUs; update the driver"
  else
    echo "+cu126"
    echo "setup: NVIDIA driver $driver is older than CUDA 13 needs (580.65.06): torch's CUDA 12.6 build from download.pytorch.org"
  fi
}
if [ "${1:-}" = --torch-build-for ]; then
  torch_build_for "${2:-}"
  exit 0
fi

# System packages: libzmq headers for the op, libjpeg-turbo headers for the ROI decoder, a C++ compiler, venv support.
missing=()
[ -f /usr/include/zmq.h ] || missing+=(libzmq3-dev)
[ -f /usr/include/jpeglib.h ] || missing+=(libjpeg62-turbo-dev)
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
# A pip configuration that names package folders this machine does not have makes pip warn about each one
# for every package (over a hundred lines): those folders are left out of this set-up's pip runs, said once.
eval "$("$VENV/bin/python" scripts/pip_locations.py)"
# A configured local index (a file:// extra-index-url) that lacks a package makes pip warn "Location '...' is
# ignored" once per package it looks up there: lines nobody can act on, dropped; every other line is kept.
pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" \
    2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$" >&2)
}
pip=(pip_install)
"${pip[@]}" --upgrade pip setuptools wheel

# TensorFlow: the `tensorflow` wheel everywhere. It carries the CUDA kernels and runs without a GPU, so
# its kernel registry can check GPU placement on any machine (tests/test_gpu_kernels.py); tensorflow-cpu,
# which overwrites the same files, is replaced. tf_keras names `tensorflow` as its dependency: --no-deps.
# One CUDA per framework (docs/gpu.md): TensorFlow 2.21 is built for CUDA 12, torch 2.14 for CUDA 13, and
# their cuDNN and NCCL wheels (nvidia-cudnn-cu12/-cu13, nvidia-nccl-cu12/-cu13) write the same files
# (nvidia/cudnn/lib/libcudnn*.so.9, nvidia/nccl/lib/libnccl.so.2). TensorFlow finds its CUDA libraries
# next to itself ($ORIGIN/../nvidia/*/lib), so on a GPU machine it goes with its CUDA 12 libraries into a
# folder of its own, $TF_GPU, on the venv's path; torch keeps CUDA 13 in site-packages. A CPU machine
# needs no CUDA for TensorFlow: the plain wheel goes into site-packages.
TF_GPU="$VENV/tensorflow-cuda12"
pyv=$("$VENV/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
site="$VENV/lib/$pyv/site-packages"
gpu=0
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu=1
have_dist() { "$VENV/bin/python" -m pip show -q "$1" >/dev/null 2>&1; }
if have_dist tensorflow-cpu; then
  "$VENV/bin/python" -m pip uninstall -y -q tensorflow-cpu
fi
if [ "$gpu" = 1 ]; then
  if [ -f "$site/feedbench-tensorflow-cuda12.pth" ] && [ -d "$TF_GPU/tensorflow" ] \
     && ls "$TF_GPU"/tensorflow-2.21.0.dist-info >/dev/null 2>&1; then
    :  # already there
  else
    # A TensorFlow in site-packages would shadow the one in $TF_GPU; its CUDA 12 wheels there overwrote
    # torch's cuDNN/NCCL files, so those are put back below.
    rm -f "$site/feedbench-tensorflow-cuda12.pth"
    rm -rf "$TF_GPU"
    if have_dist tensorflow; then "$VENV/bin/python" -m pip uninstall -y -q tensorflow; fi
    cu12=$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | sed -n 's/^\(nvidia-[a-z-]*-cu12\)==.*/\1/p' \
           | grep -v -E 'nvjpeg|nvimgcodec|nvtiff|nvcomp|dali' || true)
    if [ -n "$cu12" ]; then "$VENV/bin/python" -m pip uninstall -y -q $cu12; fi
    echo "setup: installing TensorFlow 2.21 with its CUDA 12 libraries (several GB; minutes)"
    "${pip[@]}" --target "$TF_GPU" "tensorflow[and-cuda]==2.21.0"
    echo "$(cd "$TF_GPU" && pwd)" > "$site/feedbench-tensorflow-cuda12.pth"
    reinstall_torch_cuda=1
  fi
elif ! have_dist tensorflow; then
  echo "setup: installing TensorFlow 2.21 (about 600 MB; a minute or two)"
  "${pip[@]}" "tensorflow==2.21.0"
fi
"${pip[@]}" --no-deps "tf_keras==2.21.0"

# PyTorch beside TensorFlow, for `bench_input.py --framework torch` (the same wheels run on CPU and CUDA);
# SPDL for the `spdl` reference loader. Skipped when these versions are already there: pip would
# otherwise put back what a CPU machine removes below.
have() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
driver=""
[ "$gpu" = 1 ] && driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
choice=$(torch_build_for "$driver")
suffix=$(echo "$choice" | head -1)
[ -n "$(echo "$choice" | sed -n 2p)" ] && echo "$choice" | sed -n 2p
torch_index=()
if [ -n "$suffix" ]; then
  if "${pip[@]}" --dry-run --no-deps --extra-index-url "https://download.pytorch.org/whl/${suffix#+}" \
       "torch==$TORCH$suffix" >/dev/null 2>&1; then
    torch_index=(--extra-index-url "https://download.pytorch.org/whl/${suffix#+}")
  else
    echo "setup: PyTorch has no torch $TORCH$suffix build: the CUDA 13 one is installed, and torch will not see the GPUs until the driver is 580.65.06 or newer"
    suffix=""
  fi
fi
if ! { have torch "$TORCH$suffix" && have torchvision "$TORCHVISION$suffix" && have spdl 0.8.0; }; then
  echo "setup: installing PyTorch $TORCH, torchvision and SPDL (several GB; minutes)"
  "${pip[@]}" "${torch_index[@]}" "torch==$TORCH$suffix" "torchvision==$TORCHVISION$suffix" "spdl==0.8.0"
  # PyPI's Linux torch wheels are CUDA builds: libtorch links CUDA's runtime, cuDNN and NCCL, so those
  # stay even without a GPU. Triton (about 0.9 GB) only compiles GPU kernels: a CPU machine drops it.
  if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
    "$VENV/bin/python" -m pip uninstall -y -q triton
  fi
fi

# torch's CUDA 13 wheels, put back where TensorFlow's CUDA 12 ones had overwritten or removed their files.
if [ "${reinstall_torch_cuda:-0}" = 1 ] && have torch "$TORCH$suffix"; then
  torch_cuda=$("$VENV/bin/python" -c 'import importlib.metadata as m, re
print(" ".join(r.split(";")[0].replace(" ", "") for r in m.requires("torch") or [] if r.startswith("nvidia-") and "extra ==" not in r))')
  if [ -n "$torch_cuda" ]; then "${pip[@]}" --force-reinstall --no-deps $torch_cuda; fi
fi

# Ray Data for the `ray-data` path (docs/engines.md; setup.py requires it too): installed here on its own, so a
# failure names it. TensorFlow brings the tf.data service of the `tf-data-service` path.
if ! "$VENV/bin/python" -c "import ray.data" 2>/dev/null; then
  echo "setup: installing Ray Data"
  "${pip[@]}" "ray[data]>=2.40"
fi

# The project itself (editable) with its test and DALI extras; this builds the zmq_ops op.
echo "setup: installing feedbench itself with its test tools and DALI"
"${pip[@]}" --no-build-isolation -e ".[test,dali]"
echo "setup: ready ($VENV)"
