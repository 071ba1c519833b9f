# Quickstart: `make demo` runs the whole pipeline on the embedded demo; `make test` runs the tests.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The instance `make dev` shows and the demo's CLI runs write to (the tests make their own).
DEV_HOME := $(CURDIR)/.dagster_home

.PHONY: venv demo test lint dev benchmarks clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

demo: venv
	$(BIN)/python -m dagster_project.cli demo

test: venv
	$(BIN)/python -m pytest -q

# House rules a machine checks: style (ruff, line length 120) and the package's layering (import-linter).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The Dagster UI and daemon on the same instance the demo and CLI runs use (http://127.0.0.1:3000).
dev: venv
	mkdir -p $(DEV_HOME) && cp dagster.yaml $(DEV_HOME)/dagster.yaml
	DAGSTER_HOME=$(DEV_HOME) $(BIN)/dagster dev -w workspace.yaml

benchmarks: venv
	$(BIN)/python -m benchmarks.bench_dispatcher
	$(BIN)/python -m benchmarks.bench_ingest
	$(BIN)/python -m benchmarks.bench_training_set

clean:
	-$(BIN)/dflash fleet down
	rm -rf .demo .tmp_dagster_home_*
