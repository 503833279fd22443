# The two commands a user needs: `make bench` and `make test`.
# Both set up .venv/ first (Debian packages, Python packages, the zmq_ops op).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.feedbench-installed
BENCH_ARGS ?= --bench --out results
# The suite runs in two phases. First every test but the `timing` ones, on every core the machine gives it
# plus one (pytest-xdist): many tests spend their time waiting on processes they started, and the extra
# worker fills that wait. A test module stays on one worker so its module-wide fixtures (built graphs, a
# baseline run) are made once; the longest modules (tests/durations.json, `make durations`) are handed out
# first, so no long one is left running alone at the end. Then the `timing` tests, which compare rates, ratios or CPU shares,
# one at a time with nothing of the suite beside them (tests/conftest.py skips them under parallel workers
# and measures one again, a bounded number of times, when the machine's other work spoiled it).
# TEST_ARGS=-n0 runs the first phase serially too.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) + 1)")
TEST_ARGS ?= -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25
TIMING_ARGS ?= -n0 --durations=10
# Only the modules that hold `timing` tests are collected for the serial phase: collecting the whole suite
# imports both frameworks for nothing.
TIMING_FILES := $(shell grep -l "mark\.timing" tests/test_*.py)

.PHONY: install op bench test durations gpu-check lint fuzz fuzz-asan soak clean

install: $(STAMP) op

$(STAMP): setup.py scripts/setup_env.sh
	PYTHON=$(PYTHON) bash scripts/setup_env.sh
	touch $@

# Rebuilds the op only when its sources or the installed TensorFlow changed.
op: $(STAMP)
	$(PY) zmq_ops/build.py
	$(PY) zmq_ops/build.py --receiver
	$(PY) models/tf/emulated_op/build.py
	$(PY) core/images/jpeg_roi/build.py

bench: install
	$(PY) bench_input.py $(BENCH_ARGS)

test: install
	@status=0; \
	$(PY) -m pytest $(TEST_ARGS) -m "not timing" || status=$$?; \
	echo "make test: the timing tests, alone"; \
	$(PY) -m pytest $(TIMING_ARGS) -m timing $(TIMING_FILES) || status=$$?; \
	exit $$status

# Records each test module's seconds in the first phase into tests/durations.json, which orders the modules
# (longest first) in later runs: run it after adding or changing long tests, and commit the file.
durations: install
	$(PY) -m pytest $(TEST_ARGS) -m "not timing" --record-durations tests/durations.json

# On a machine with GPUs: placement, bandwidth and a short run of both trainers (docs/gpu.md).
gpu-check: install
	$(PY) -m benchmarks.gpu_check

# The native code (ROI decoder, wire decoders, receiver) fuzzed under AddressSanitizer and
# UndefinedBehaviorSanitizer for FUZZ_SECONDS per target (scripts/fuzz_native.py builds its own sanitized
# fuzzers into build/fuzz-asan/). Needs .venv but does not reinstall it.
FUZZ_SECONDS ?= 60
fuzz-asan:
	$(PY) scripts/fuzz_native.py --seconds $(FUZZ_SECONDS)

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean:
	rm -rf build *.egg-info zmq_ops/*.so models/tf/emulated_op/*.so results
