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

.PHONY: demo test test-pythons test-capture-off
demo: $(BIN)/.installed
	$(BIN)/python examples/demo.py

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q tests
	$(MAKE) --no-print-directory test-capture-off
	$(MAKE) --no-print-directory test-pythons

# The capture tests once more with capture switched off (TEMPA_CAPTURE=0: every compiled
# call runs eagerly). Each must FAIL (tests/capture/conftest.py makes every one a strict
# xfail): a test that still passes checks what eager computes, not what tempa captured.
# Tests that never reach capture are marked capture_independent (with why) and left out.
test-capture-off: $(BIN)/.installed
	TEMPA_CAPTURE=0 $(BIN)/python -m pytest -q -rfE -p no:cacheprovider tests/capture

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
