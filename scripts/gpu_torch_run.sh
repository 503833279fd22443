#!/usr/bin/env bash
# The PyTorch half on one real GPU, in one go: what docs/gpu.md's measured tables come from.
#
#   bash scripts/gpu_torch_run.sh OUT_DIR [BUDGET_S] [STEPS]
#
# STEPS (comma-separated, default all): env, bandwidth, headline, shm, input-only, real-data, check, capacity.
# The whole runs within BUDGET_S (default 420 s), so the script ends in time on a machine lent by the
# minute: each wanted step's cap is its share (WEIGHTS) of the budget, the caps of the wanted steps add up
# to the budget less RESERVE_S for the last lines; a step that overruns is stopped with SIGINT (the trainer
# then stops its producers and frees its shared memory) and the next one runs. Each step's output goes to
# OUT_DIR/run.log, which starts with the code's commit, and its JSON beside it; OUT_DIR/results.tar.gz
# holds them all. What is known already is not measured again: the `cpu` path (PyTorch making random
# images on the step's own thread: 0.25 of the baseline on an H200, docs/gpu.md) is left out of the
# headline, input-only and capacity runs; the check still trains it.
# It needs only torch (with CUDA), torchvision, numpy, msgpack, psutil, pyzmq and nvidia-ml-py: no
# TensorFlow, no DALI. SMALL=1 shrinks every run (batch 8, 64x64, few steps, an emulated device for the
# ResNet-50 runs) to try the script on a machine without a GPU.
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
RESERVE_S=10  # the last lines: what was left behind, the archive
# Each step's share of the budget (the capacity search and the headline's alternated runs take the most).
declare -A WEIGHTS=([env]=5 [bandwidth]=5 [headline]=23 [shm]=10 [input-only]=10 [real-data]=25 [check]=12 [capacity]=30)
FED=python-queue,python-dataset,zmq-consume  # the paths measured: every default one but cpu

# The ResNet-50 runs: 1 GPU, batch 256, mixed precision, channels-last, 8 producer processes.
MODEL=(--framework torch --num-gpus 1 --batch 256 --use-fp16 --data-format NHWC --producers 8
       --warmup-steps 15 --steps 25 --repeats 5)
CHECK=(--use-fp16)
BW=(--mb 1,8,39,256 --repeats 7)
CAPACITY=(--framework torch --find-capacity --emulate H100 --capacity-probes 3 --capacity-tries 0 --fake-location "$FED")
EMULATED=()  # the ResNet-50 runs' model: the real one
if [ "${SMALL:-0}" = 1 ]; then
    MODEL=(--framework torch --num-gpus 1 --batch 8 --image-size 64 --producers 2
           --warmup-steps 2 --steps 4 --repeats 3)
    EMULATED=(--emulate-rate 400)  # ResNet-50 on a few CPU cores would take its steps' minutes: an emulated device
    CAPACITY=(--framework torch --find-capacity --emulate H100 --capacity-probes 2 --capacity-tries 0
              --fake-location zmq-consume)
    CHECK=(--batch 8 --image-size 64 --warmup-steps 2 --steps 3 --repeats 2)
    BW=(--mb 1,8 --repeats 3)
fi

wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

# cap NAME: NAME's share of the budget, among the wanted steps.
cap() {
    local total=0 name
    for name in "${!WEIGHTS[@]}"; do wanted "$name" && total=$((total + WEIGHTS[$name])); done
    echo $(((BUDGET - RESERVE_S) * WEIGHTS[$1] / (total > 0 ? total : 1)))
}

# step NAME COMMAND...: run COMMAND if NAME is wanted, at most its cap and within the budget.
step() {
    local name=$1; shift
    wanted "$name" || return 0
    local cap=$(cap "$name")
    local left=$((END - $(date +%s)))
    ((cap > left)) && cap=$left
    if ((cap < 10)); then
        echo "== $name: skipped, out of time" | tee -a "$LOG"
        return 0
    fi
    echo "== $name (cap ${cap} s): $*" | tee -a "$LOG"
    local t0=$(date +%s)
    local grace=$((cap / 4 < 15 ? cap / 4 : 15))  # for the trainer to stop its producers after SIGINT
    timeout -s INT --kill-after=$grace "$((cap - grace))" "$@" 2>&1 | tee -a "$LOG"  # killed at its cap
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

# The code measured: its commit (and whether the tree had changes), first in the log.
stamp() {
    local commit
    commit=$(git rev-parse HEAD 2>/dev/null) || commit="unknown (not a git checkout)"
    [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit, with uncommitted changes"
    echo "== code: feedbench $commit; budget ${BUDGET} s; steps $STEPS" | tee -a "$LOG"
}
stamp

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
step env bash -c env_report
step bandwidth "$PY" -m harness.torch.bandwidth "${BW[@]}"
step headline "$PY" bench_input.py "${MODEL[@]}" "${EMULATED[@]}" --fake-location "$FED" --json "$OUT/headline.json"
step shm "$PY" bench_input.py "${MODEL[@]}" "${EMULATED[@]}" --fake-location zmq-consume --transport shm \
    --json "$OUT/shm.json"
step input-only "$PY" bench_input.py "${MODEL[@]}" --fake-location "$FED" --input-only --json "$OUT/input_only.json"
step real-data bash -c 'real_data "$@"' real_data "${MODEL[@]}"
step check "$PY" -m harness.torch.gpu_check "${CHECK[@]}" \
    --paths gpu,cpu,python-queue,python-dataset,zmq-consume,zmq-consume-shm --json "$OUT/check.json"
step capacity "$PY" bench_input.py "${CAPACITY[@]}" --json "$OUT/capacity.json"

# What a run may leave: shared memory, and producer or rank processes (python -m producers / harness.torch.run).
left=$(pgrep -c -f "^[^ ]*python[0-9.]* -m (producers|harness\.torch)" || true)
echo "== left behind: $(ls /dev/shm | wc -l) entries in /dev/shm; producer or rank processes: $left" | tee -a "$LOG"
tar -C "$OUT" -czf "$OUT/results.tar.gz" --exclude results.tar.gz . 2>/dev/null
exit 0
