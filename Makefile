# Idempotent set-up: `make venv` creates .venv once (torch==2.13.0 first, so pip never pulls CUDA wheels).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test train lint clean
venv: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,popgym,minigrid,faiss,study,video]"
	touch $(STAMP)

test: venv
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --max-worker-restart 0 --timeout 900 --timeout-method signal --durations 10

train: venv
	$(BIN)/python scripts/train_gtrxl.py

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

clean:
	rm -rf $(VENV)
