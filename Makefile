# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Each creates .venv if missing and installs torch (CPU wheel) BEFORE tempa, so pip
# never resolves a bare `torch` requirement to a multi-GB CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $@

.PHONY: demo test
demo: $(BIN)/.installed
	$(BIN)/python examples/demo.py

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q tests
