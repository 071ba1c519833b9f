# Quickstart: `make demo` runs the whole pipeline on the embedded demo; `make test` runs the tests
# (`make test-fast` the unit tests alone).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The instance `make dev` shows and the demo's CLI runs write to (the tests make their own).
DEV_HOME := $(CURDIR)/.dagster_home

.PHONY: venv demo test test-fast lint dev benchmarks rehearsal soak clean sglang-cpu test-sglang

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

# The evaluation sets the demo checks prompts against, when the shared fixtures sit beside the checkout
# (override with your own files: make demo EVAL_SETS=a.jsonl,b.jsonl).
comma := ,
empty :=
space := $(empty) $(empty)
EVAL_SETS ?= $(subst $(space),$(comma),$(wildcard ../shared/data/eval_sets/*/*))

demo: venv
	DFLASH_EVAL_SETS="$(EVAL_SETS)" $(BIN)/python -m dagster_project.cli demo

# How many pytest-xdist workers `make test` runs the tests on. More than the cores: most integration tests wait on
# processes they started (simulators, Dagster runs, `dagster dev`). Not yet measured against 2 and 3 on quiet cores.
TEST_WORKERS ?= 4
# `loadscope`: each module runs whole on one worker, in order, so a module-scoped fixture (a fleet, a published store,
# `dagster dev`) is made once; the modules go to whichever worker is free, the slowest first (tests/conftest.py).
# (Not `loadgroup`: with pytest 9.2 it no longer groups, xdist 3.8 renames a test's nodeid through `_nodeid`.)
# `--no-loadscope-reorder`: in that order, not xdist's default of the modules with the most tests first (which
# started the three `dagster dev` modules last).
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# Every test: tests/unit/ and tests/integration/. It first checks the tools outside Python it needs (Chromium and
# its driver, PostgreSQL, the shared fixtures) and fails naming how to install any that is missing; no test skips
# but the GPU-only one (a skip fails the run: tests/conftest.py).
test: lint
	$(BIN)/python -m tests.support.required_tools
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The unit tests alone (tests/unit/). Skips everything marked `integration` (all of tests/integration/): the tests
# that drive Dagster (its CLI, `dagster dev`, an instance) or start servers: the moto S3 server, simulator fleets,
# the real sglang-router, fault injection, the CLI pipeline. The quick target: a test whose tool (the shared
# fixtures) is missing skips here, naming it.
test-fast: venv
	TESTS_MAY_SKIP=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not integration"

# The real-SGLang tier: SGLang 0.5.23 itself on this machine's CPU, in an environment of its own (~11 GB, ~9.5 min
# from the registry; pip's cache makes a rebuild fast). Never in the project's environment: its CUDA torch and
# pins would replace the project's. `make test-sglang SGLANG_VENV=/path/to/env` uses one built elsewhere.
SGLANG_VENV ?= $(CURDIR)/.venv-sglang
SGLANG_VERSION := 0.5.23

sglang-cpu: $(SGLANG_VENV)/.installed

$(SGLANG_VENV)/.installed:
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install --quiet --disable-pip-version-check 'sglang==$(SGLANG_VERSION)'
	$(SGLANG_VENV)/bin/python -c "import sglang; assert sglang.__version__ == '$(SGLANG_VERSION)', sglang.__version__"
	touch $@

# The conformance suite (the same assertions against the real server and the simulator) and the pipeline against
# the real server, faults included: tests/sglang_real/ (5.5 min on 2 quiet cores, ~15 busy; `make test` leaves it out).
test-sglang: venv sglang-cpu
	REQUIRE_SGLANG=1 SGLANG_PYTHON=$(SGLANG_VENV)/bin/python $(BIN)/python -m pytest -q tests/sglang_real

# House rules a machine checks: style (ruff, line length 120) and the package's layering (import-linter).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# How long the daemon waits for the code server to start a run (Dagster's gRPC deadline, 60 s by default): the
# code server answers once the run's new process has imported Dagster and opened the instance (~5 CPU-s), which
# on 2 busy cores (8 runs starting or running) takes longer than 60 s; a launch past the deadline fails the run.
LAUNCH_TIMEOUT_S ?= 300

# The Dagster UI and daemon on the same instance the demo and CLI runs use (http://127.0.0.1:3000).
# The UI and the daemon open the instance at once: dagster.yaml's instance class makes its databases under a lock
# on the home, and `dagster instance migrate` brings an older home up to date first.
dev: venv
	mkdir -p $(DEV_HOME) && cp dagster.yaml $(DEV_HOME)/dagster.yaml
	DAGSTER_HOME=$(DEV_HOME) $(BIN)/dagster instance migrate >/dev/null
	DAGSTER_HOME=$(DEV_HOME) DAGSTER_GRPC_TIMEOUT_SECONDS=$(LAUNCH_TIMEOUT_S) $(BIN)/dagster dev -w workspace.yaml

# About 2.5 h on 2 cores: bench_fleet alone runs each of its four rows for ~15 min at the real latency model
# (`--time-scale 0.2` for a ~20 min run of the same shape), and bench_andon its rows directly and through
# `dagster dev` (~30 min).
benchmarks: venv
	$(BIN)/python -m benchmarks.bench_dispatcher
	$(BIN)/python -m benchmarks.bench_fleet
	$(BIN)/python -m benchmarks.bench_run_overhead
	$(BIN)/python -m benchmarks.bench_shards_per_run
	$(BIN)/python -m benchmarks.bench_ingest
	$(BIN)/python -m benchmarks.bench_training_set
	$(BIN)/python -m benchmarks.bench_tune
	$(BIN)/python -m benchmarks.bench_profiles
	$(BIN)/python -m benchmarks.bench_spec_tune
	$(BIN)/python -m benchmarks.bench_status_scale
	$(BIN)/python -m benchmarks.bench_status_process
	$(BIN)/python -m benchmarks.bench_contamination
	$(BIN)/python -m benchmarks.bench_gates
	$(BIN)/python -m benchmarks.bench_set_aside
	$(BIN)/python -m benchmarks.bench_waste
	$(BIN)/python -m benchmarks.bench_andon

# The dress rehearsal (stops after 60 min): one backfill over 1,830 partitions on PostgreSQL and S3 with
# `dagster dev`, sensors on, the head node measured; writes its table into BENCHMARKS.md (`--shards N` for fewer).
rehearsal: venv
	$(BIN)/python -m benchmarks.bench_rehearsal

# The fault-matrix soak (20-40 min), then the promises harness on 200 random jobs (up to 30 min); not part of
# `make test` (which runs the harness's fixed seeds): both write their tables into RELIABILITY.md.
soak: venv
	$(BIN)/python -m benchmarks.soak_faults --write
	$(BIN)/python -m benchmarks.soak_harness --write

clean:
	-$(BIN)/dflash fleet down
	rm -rf .demo .tmp_dagster_home_*
