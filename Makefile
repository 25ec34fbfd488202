# Quickstart targets: `make run` (the main job) and `make test` (lint + the whole suite).
# Both create the virtual environment and install anekit into it first.
#
# `make run` trains the default model into $(OUT). Run again, it resumes the run $(OUT) holds: anekit says in
# one line whether it continues it or, the run being finished, only samples it (writing nothing).
# `make run ARGS=--force` starts over, and ARGS passes any other `anekit train` flags
# (`make run ARGS="--steps 100 --force"`).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.anekit-installed
OUT ?= out
ARGS ?=
# pytest's summary lists failures and errors; skipped tests are summed up in one line per reason (by
# tests/conftest.py): `pytest -rs` lists each.
PYTEST_REPORT := -rfExX

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,plot,fast]'
	touch $(STAMP)

run: $(STAMP)
	@if [ -z '$(ARGS)' ] && [ -f '$(OUT)/ckpt.bin' ]; then \
		echo "$(BIN)/anekit train --out $(OUT) --resume   # $(OUT)/ holds a run (make run ARGS=--force starts over)"; \
		$(BIN)/anekit train --out '$(OUT)' --resume; \
	else \
		echo "$(BIN)/anekit train --out $(OUT) $(ARGS)"; \
		$(BIN)/anekit train --out '$(OUT)' $(ARGS); \
	fi

# lint-imports checks pyproject.toml's layer contract ([tool.importlinter]) on this checkout's source; mypy
# type-checks src/anekit with pyproject.toml's [tool.mypy] settings (0 errors, no stale ignores).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=src $(BIN)/lint-imports --no-cache
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q $(PYTEST_REPORT)

bench: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/python benchmarks/bench_mil_parse.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
