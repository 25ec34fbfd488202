# Quickstart targets: `make run` (the main job) and `make test` (lint + the whole suite).
# Both create the virtual environment and install anekit into it first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.anekit-installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,plot,fast]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/anekit train

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/python benchmarks/bench_mil_parse.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
