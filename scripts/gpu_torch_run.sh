#!/usr/bin/env bash
# The PyTorch half on one real GPU, in one go: what docs/gpu.md's measured tables come from.
#
#   bash scripts/gpu_torch_run.sh OUT_DIR [BUDGET_S] [STEPS]
#
# STEPS (comma-separated, default all): env, bandwidth, headline, shm, input-only, real-data, check, capacity.
# Every step runs under its own cap and the whole under BUDGET_S (default 420 s), so the script ends in
# time on a machine lent by the minute; a step that overruns is stopped with SIGINT (the trainer then
# stops its producers and frees its shared memory) and the next one runs. Each step's output goes to
# OUT_DIR/run.log and its JSON beside it; OUT_DIR/results.tar.gz holds them all.
# It needs only torch (with CUDA), torchvision, numpy, msgpack, psutil and pyzmq: no TensorFlow, no DALI.
# SMALL=1 shrinks every run (batch 8, 64x64, few steps) to try the script on a machine without a GPU.
set -u
OUT=${1:?usage: gpu_torch_run.sh OUT_DIR [BUDGET_S] [STEPS]}
BUDGET=${2:-420}
STEPS=${3:-env,bandwidth,headline,shm,input-only,real-data,check,capacity}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
LOG="$OUT/run.log"
END=$(($(date +%s) + BUDGET))
export PYTHONUNBUFFERED=1

# The ResNet-50 runs: 1 GPU, batch 256, mixed precision, channels-last, 8 producer processes.
MODEL=(--framework torch --num-gpus 1 --batch 256 --use-fp16 --data-format NHWC --producers 8
       --warmup-steps 15 --steps 25 --repeats 5)
CHECK=(--use-fp16)
BW=(--mb 1,8,39,256 --repeats 7)
CAPACITY=(--framework torch --find-capacity --emulate H100 --capacity-probes 3 --capacity-tries 0)
if [ "${SMALL:-0}" = 1 ]; then
    MODEL=(--framework torch --num-gpus 1 --batch 8 --image-size 64 --producers 2
           --warmup-steps 2 --steps 4 --repeats 3)
    CHECK=(--batch 8 --image-size 64 --warmup-steps 2 --steps 3 --repeats 2)
    BW=(--mb 1,8 --repeats 3)
fi

wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

# step NAME CAP_S COMMAND...: run COMMAND if NAME is wanted, at most CAP_S seconds and within the budget.
step() {
    local name=$1 cap=$2; shift 2
    wanted "$name" || return 0
    local left=$((END - $(date +%s)))
    ((cap > left)) && cap=$left
    if ((cap < 15)); then
        echo "== $name: skipped, out of time" | tee -a "$LOG"
        return 0
    fi
    echo "== $name (cap ${cap} s): $*" | tee -a "$LOG"
    local t0=$(date +%s)
    timeout -s INT --kill-after=15 "$cap" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $(($(date +%s) - t0)) s" | tee -a "$LOG"
}

env_report() {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
    nvidia-smi -q | grep -iE "CUDA Version|Persistence|Bus Id" | head -4
    "$PY" -c "import sys, torch, torchvision; print('python', sys.version.split()[0], 'torch', torch.__version__,
'torchvision', torchvision.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
    echo "cores: $(nproc); memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    lscpu | grep -E "Model name|Socket|NUMA node\(s\)"
    df -h /dev/shm | tail -1
    ulimit -l | sed 's/^/locked-memory limit (ulimit -l): /'
}

# real-data: an ImageNet-like folder made on the machine (2,000 files; SMALL=1: 40), then every way to feed the
# model from it (bench_input.py --real-data: decode producers over shm://, the ImageFolder DataLoader, gpu-decode,
# dali/spdl where installed); the folder is removed afterwards, so results.tar.gz holds only the figures.
# SMALL=1 feeds the input-only stand-in instead of ResNet-50, whose steps take seconds on a host's cores.
real_data() {
    local data="$OUT/real-data-jpegs" classes=20 per_class=100 small=()
    [ "${SMALL:-0}" = 1 ] && classes=4 per_class=10 small=(--input-only)
    "$PY" -m producers make-dataset "$data" --like imagenet --classes "$classes" --per-class "$per_class" &&
        "$PY" bench_input.py "$@" "${small[@]}" --real-data --data "$data" --json "$OUT/real_data.json"
    local rc=$?
    rm -rf "$data"
    return "$rc"
}

export -f env_report real_data; export PY OUT
step env 30 bash -c env_report
step bandwidth 60 "$PY" -m harness.torch.bandwidth "${BW[@]}"
step headline 170 "$PY" bench_input.py "${MODEL[@]}" --json "$OUT/headline.json"
step shm 80 "$PY" bench_input.py "${MODEL[@]}" --fake-location zmq-consume --transport shm --json "$OUT/shm.json"
step input-only 70 "$PY" bench_input.py "${MODEL[@]}" --input-only --json "$OUT/input_only.json"
step real-data 240 bash -c 'real_data "$@"' real_data "${MODEL[@]}"
step check 100 "$PY" -m harness.torch.gpu_check "${CHECK[@]}" \
    --paths gpu,cpu,python-queue,python-dataset,zmq-consume,zmq-consume-shm --json "$OUT/check.json"
step capacity 400 "$PY" bench_input.py "${CAPACITY[@]}" --json "$OUT/capacity.json"

# What a run may leave: shared memory, and producer or rank processes (python -m producers / harness.torch.run).
left=$(pgrep -c -f "^[^ ]*python[0-9.]* -m (producers|harness\.torch)" || true)
echo "== left behind: $(ls /dev/shm | wc -l) entries in /dev/shm; producer or rank processes: $left" | tee -a "$LOG"
tar -C "$OUT" -czf "$OUT/results.tar.gz" --exclude results.tar.gz . 2>/dev/null
exit 0
