#!/usr/bin/env bash
# The PyTorch half on one real GPU, in one go: what docs/gpu.md's measured tables come from.
#
#   bash scripts/gpu_torch_run.sh OUT_DIR [BUDGET_S] [STEPS]
#
# STEPS (comma-separated; default env,gpu-tests,headline,shm,dataset,real-data,emulated,ceiling; also bandwidth,
# input-only, check and capacity, which the last run measured already):
#   gpu-tests  the tests that need a CUDA GPU (side-stream copies, nvJPEG decoding);
#   headline   ResNet-50 fed by every default path but cpu, each ratio from alternated windows (--interleave);
#   shm        zmq-consume over shm:// against the same baseline, alternated too;
#   dataset    an ImageNet-like folder made on the machine (2,000 files), removed at the end;
#   real-data  every way to feed ResNet-50 from that folder (--real-data) at each of INPUT_CORES input cores;
#   emulated   the same, against an emulated device at the baseline rate the headline measured: the prediction
#              checked against the real device, at the same input cores;
#   ceiling    zmq-consume's own ceiling: input-only over shm:// with enough producers that they do not limit.
# The whole runs within BUDGET_S (default 420 s), so the script ends in time on a machine lent by the
# minute: each wanted step's cap is its share (WEIGHTS) of the time left among the steps not run yet, less
# RESERVE_S for the last lines, so a step that ends early leaves its time to the later ones; a step that
# overruns is stopped with SIGINT (the trainer
# then stops its producers and frees its shared memory) and the next one runs; a step of several runs gives
# each its share of the step's cap, so a slow first run never costs the second its result file. Each step's
# output goes to OUT_DIR/run.log, which starts with the code's commit, and its JSON beside it;
# OUT_DIR/results.tar.gz holds them all. Paths fed by producers only: the `cpu` path (PyTorch making random
# images on the step's own thread) measured 0.25 of the baseline on an H200 (docs/gpu.md).
# It needs only torch (with CUDA), torchvision, numpy, msgpack, psutil, pyzmq, nvidia-ml-py and pytest: no
# TensorFlow, no DALI. SMALL=1 shrinks every run (batch 8, 64x64, few steps, an emulated device for the
# ResNet-50 runs) to try the script on a machine without a GPU.
set -u
OUT=${1:?usage: gpu_torch_run.sh OUT_DIR [BUDGET_S] [STEPS]}
BUDGET=${2:-420}
STEPS=${3:-env,gpu-tests,headline,shm,dataset,real-data,emulated,ceiling}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/run.log"
END=$(($(date +%s) + BUDGET))
export PYTHONUNBUFFERED=1
RESERVE_S=10  # the last lines: what was left behind, the archive
# Each step's share of the budget (the alternated headline and the real-data runs take the most).
declare -A WEIGHTS=([env]=4 [gpu-tests]=4 [headline]=25 [shm]=9 [dataset]=9 [real-data]=27 [emulated]=16 [ceiling]=6 [bandwidth]=3 [input-only]=8 [check]=10 [capacity]=25)
FED=python-queue,python-dataset,zmq-consume  # the paths measured: every default one but cpu
INPUT_CORES=(4 12)  # --real-data's producers (and DataLoader workers): where each path stops keeping up
DATA="$OUT/real-data-jpegs"  # made by the dataset step, removed at the end
CLASSES=20 PER_CLASS=100

# The ResNet-50 runs: 1 GPU, batch 256, mixed precision, channels-last, 8 producer processes.
MODEL=(--framework torch --num-gpus 1 --batch 256 --use-fp16 --data-format NHWC --producers 8
       --warmup-steps 15 --steps 25 --repeats 3)
# --real-data's runs: shorter windows (a path far from the baseline needs no alternation to read its ratio).
REAL=(--framework torch --num-gpus 1 --batch 256 --use-fp16 --data-format NHWC
      --warmup-steps 5 --steps 10 --repeats 3 --interleave 0)
CEILING=(--framework torch --num-gpus 1 --batch 256 --input-only --transport shm --producers 14
         --warmup-steps 10 --steps 25 --repeats 3 --interleave 0)
CHECK=(--use-fp16)
BW=(--mb 1,8,39,256 --repeats 7)
CAPACITY=(--framework torch --find-capacity --emulate H100 --capacity-probes 3 --capacity-tries 0 --fake-location "$FED")
EMULATED=()  # the ResNet-50 runs' model: the real one
REAL_MODEL=()
if [ "${SMALL:-0}" = 1 ]; then
    MODEL=(--framework torch --num-gpus 1 --batch 8 --image-size 64 --producers 2
           --warmup-steps 2 --steps 4 --repeats 3 --interleave 2)
    EMULATED=(--emulate-rate 400)  # ResNet-50 on a few CPU cores would take its steps' minutes: an emulated device
    REAL=(--framework torch --num-gpus 1 --batch 8 --image-size 64 --warmup-steps 2 --steps 4 --repeats 3)
    REAL_MODEL=(--input-only)  # the real-data step's model: the input-only stand-in
    CEILING=(--framework torch --num-gpus 1 --batch 8 --image-size 64 --input-only --transport shm --producers 2
             --warmup-steps 2 --steps 4 --repeats 3)
    CAPACITY=(--framework torch --find-capacity --emulate H100 --capacity-probes 2 --capacity-tries 0
              --fake-location zmq-consume)
    CHECK=(--batch 8 --image-size 64 --warmup-steps 2 --steps 3 --repeats 2)
    BW=(--mb 1,8 --repeats 3)
    INPUT_CORES=(1 2)
    CLASSES=4 PER_CLASS=10
fi

wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

# cap NAME: NAME's share of the time left, among the wanted steps not run yet: a step that ends early leaves
# its time to the steps after it, and the caps of the steps still to run never add up to more than is left.
UNRUN=0
for name in "${!WEIGHTS[@]}"; do [[ ",$STEPS," == *",$name,"* ]] && UNRUN=$((UNRUN + WEIGHTS[$name])); done
cap() {
    local left=$((END - RESERVE_S - $(date +%s)))
    echo $((left * WEIGHTS[$1] / (UNRUN > 0 ? UNRUN : 1)))
}

# capped SECONDS COMMAND...: COMMAND stopped with SIGINT at SECONDS, killed a grace period later.
capped() {
    local cap=$1; shift
    local grace=$((cap / 4 < 15 ? cap / 4 : 15))  # for the trainer to stop its producers after SIGINT
    timeout -s INT --kill-after=$grace "$((cap - grace))" "$@"
}

# step NAME COMMAND...: run COMMAND if NAME is wanted, at most its cap and within the budget.
step() {
    local name=$1; shift
    wanted "$name" || return 0
    local cap=$(cap "$name")
    UNRUN=$((UNRUN - WEIGHTS[$name]))
    if ((cap < 10)); then
        echo "== $name: skipped, out of time" | tee -a "$LOG"
        return 0
    fi
    echo "== $name (cap ${cap} s): $*" | tee -a "$LOG"
    local t0=$(date +%s)
    export STEP_CAP=$cap  # a step of several runs shares it out (each_cores)
    capped "$cap" "$@" 2>&1 | tee -a "$LOG"  # killed at its cap
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $(($(date +%s) - t0)) s" | tee -a "$LOG"
}

env_report() {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,clocks.mem,power.limit,temperature.gpu --format=csv
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
    # FEEDBENCH_COMMIT: the commit of a tree copied to another machine, whose .git (if any) may be older.
    if [ -n "${FEEDBENCH_COMMIT:-}" ]; then
        commit="$FEEDBENCH_COMMIT (as given)"
    else
        commit=$(git rev-parse HEAD 2>/dev/null) || commit="unknown (not a git checkout)"
        [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit, with uncommitted changes"
    fi
    echo "== code: feedbench $commit; budget ${BUDGET} s; steps $STEPS" | tee -a "$LOG"
}
stamp

# each_cores NAME ARGS...: bench_input.py --real-data ARGS at each of INPUT_CORES producers (and DataLoader
# workers), each run within its share of the step's cap, its JSON NAME-pN.json whatever the other run did.
each_cores() {
    local name=$1; shift
    local n share=$((STEP_CAP / ${#INPUT_CORES[@]}))
    for n in "${INPUT_CORES[@]}"; do
        echo "-- $name with $n input cores (cap $share s)"
        capped "$share" "$PY" bench_input.py "$@" --real-data --data "$DATA" --producers "$n" \
            --json "$OUT/$name-p$n.json"
        echo "-- $name with $n input cores: exit $?"
    done
}

# The baseline's images/s in the headline (what the emulated device is set to), or the last run's 6,100.
baseline_rate() {
    "$PY" -c "import json, sys; print(round(json.load(open(sys.argv[1]))['paths']['gpu']['images_per_sec']['median']))" \
        "$OUT/headline.json" 2>/dev/null || echo 6100
}

emulated() {
    local rate
    if [ "${SMALL:-0}" = 1 ]; then rate=400; else rate=$(baseline_rate); fi
    echo "-- the emulated device at the headline's baseline: $rate images/s"
    each_cores emulated "${REAL[@]}" --emulate-rate "$rate"
    local n
    for n in "${INPUT_CORES[@]}"; do  # the prediction beside the real device, path by path
        [ -f "$OUT/real_data-p$n.json" ] && [ -f "$OUT/emulated-p$n.json" ] &&
            "$PY" -m benchmarks.emulated_vs_real "$OUT/real_data-p$n.json" "$OUT/emulated-p$n.json"
    done
    return 0
}

gpu_tests() {
    "$PY" -m pytest -q -p no:cacheprovider tests/test_device_copy.py tests/test_loader_side_stream.py \
        tests/test_gpu_decode_device.py
}

export -f env_report each_cores capped baseline_rate emulated gpu_tests
export PY OUT DATA SMALL="${SMALL:-0}"
export INPUT_CORES_LIST="${INPUT_CORES[*]}" REAL_LIST="${REAL[*]}" REAL_MODEL_LIST="${REAL_MODEL[*]}"
step env bash -c env_report
step gpu-tests bash -c gpu_tests
step bandwidth "$PY" -m harness.torch.bandwidth "${BW[@]}"
step headline "$PY" bench_input.py "${MODEL[@]}" "${EMULATED[@]}" --fake-location "$FED" --json "$OUT/headline.json"
step shm "$PY" bench_input.py "${MODEL[@]}" "${EMULATED[@]}" --fake-location zmq-consume --transport shm \
    --json "$OUT/shm.json"
step input-only "$PY" bench_input.py "${MODEL[@]}" --fake-location "$FED" --input-only --json "$OUT/input_only.json"
step dataset "$PY" -m producers make-dataset "$DATA" --like imagenet --classes "$CLASSES" --per-class "$PER_CLASS"
step real-data bash -c 'INPUT_CORES=($INPUT_CORES_LIST); each_cores real_data $REAL_LIST $REAL_MODEL_LIST'
step emulated bash -c 'INPUT_CORES=($INPUT_CORES_LIST); REAL=($REAL_LIST); emulated'
step ceiling "$PY" bench_input.py "${CEILING[@]}" --fake-location zmq-consume --json "$OUT/ceiling.json"
step check "$PY" -m harness.torch.gpu_check "${CHECK[@]}" \
    --paths gpu,cpu,python-queue,python-dataset,zmq-consume,zmq-consume-shm --json "$OUT/check.json"
step capacity "$PY" bench_input.py "${CAPACITY[@]}" --json "$OUT/capacity.json"
rm -rf "$DATA"  # results.tar.gz holds only the figures

# What a run may leave: shared memory, and producer or rank processes (python -m producers / harness.torch).
left=$(pgrep -c -f "^[^ ]*python[0-9.]* -m (producers|harness\.torch)" || true)
echo "== left behind: $(ls /dev/shm | wc -l) entries in /dev/shm; producer or rank processes: $left" | tee -a "$LOG"
tar -C "$OUT" -czf "$OUT/results.tar.gz" --exclude results.tar.gz . 2>/dev/null
exit 0
