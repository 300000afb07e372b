# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Each creates .venv if missing and installs torch (CPU wheel) BEFORE tempa, so pip
# never resolves a bare `torch` requirement to a multi-GB CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Other CPython versions (3.12, 3.13) for the torch-free frontend tests: bytecode decoding,
# liveness and resume functions differ per version. Found through pyenv when installed.
OTHER_PYTHONS ?= $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python $(HOME)/.pyenv/versions/3.13*/bin/python)
TORCH_FREE_TESTS := tests/capture/test_resume.py tests/capture/test_liveness.py

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $@

.PHONY: demo test test-pythons
demo: $(BIN)/.installed
	$(BIN)/python examples/demo.py

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q tests
	$(MAKE) --no-print-directory test-pythons

# Each other Python gets a small venv of its own (pytest and bytecode, no torch).
test-pythons:
	@if [ -z "$(strip $(OTHER_PYTHONS))" ]; then echo "test-pythons: no CPython 3.12/3.13 found; skipped"; fi
	@set -e; for py in $(OTHER_PYTHONS); do \
	  ver=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); venv=.venv-$$ver; \
	  [ -x $$venv/bin/pytest ] || { $$py -m venv $$venv && $$venv/bin/pip install -q pytest 'bytecode>=0.16'; }; \
	  echo "torch-free frontend tests on CPython $$ver:"; \
	  $$venv/bin/python -m pytest -q -p no:cacheprovider $(TORCH_FREE_TESTS) > $$venv/last.log \
	    || { cat $$venv/last.log; exit 1; }; tail -n 1 $$venv/last.log; \
	done
