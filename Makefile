# The two commands a user needs: `make bench` and `make test`.
# Both set up .venv/ first (Debian packages, Python packages, the zmq_ops op).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.feedbench-installed
BENCH_ARGS ?= --bench --out results
# The suite runs on every core the machine gives it plus one (pytest-xdist): many tests spend their time
# waiting on processes they started, and the extra worker fills that wait (2 cores: 15.9 min, against
# 18.4 with two workers). A test module stays on one worker so its module-wide fixtures (built graphs,
# a baseline run) are made once. TEST_ARGS=-n0 runs it serially.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) + 1)")
TEST_ARGS ?= -n $(TEST_WORKERS) --dist loadfile --durations=25

.PHONY: install op bench test gpu-check lint fuzz soak clean

install: $(STAMP) op

$(STAMP): setup.py scripts/setup_env.sh
	PYTHON=$(PYTHON) bash scripts/setup_env.sh
	touch $@

# Rebuilds the op only when its sources or the installed TensorFlow changed.
op: $(STAMP)
	$(PY) zmq_ops/build.py
	$(PY) zmq_ops/build.py --receiver
	$(PY) tf_trainer/models/emulated_op/build.py

bench: install
	$(PY) bench_input.py $(BENCH_ARGS)

test: install
	$(PY) -m pytest $(TEST_ARGS)

# On a machine with GPUs: placement, bandwidth and a short run of both trainers (docs/gpu.md).
gpu-check: install
	$(PY) -m benchmarks.gpu_check

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean:
	rm -rf build *.egg-info zmq_ops/*.so tf_trainer/models/emulated_op/*.so results
