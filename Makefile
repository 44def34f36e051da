# Two commands do everything on a fresh machine:
#   make demo   create .venv, install, run the embedded default experiment
#   make test   create .venv, install, run the default test tier
# An already-installed torch is kept; otherwise torch==2.13.0 is installed first (CPU wheel where
# one is provided), so no dependency can pull a different torch with several GB of CUDA packages.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
EXTRAS ?= dev,ray
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: demo test test-all test-gpu install bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(PY) pyproject.toml
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "keeping the installed torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
	  $(PY) -m pip install -q "$(TORCH)"; \
	fi
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $@

install: $(VENV)/.installed

demo: install
	$(PY) run_parallel.py experiment.name=demo

test: install
	$(PY) -m pytest -q

test-all: install   # every tier; gpu tests skip themselves without CUDA
	$(PY) -m pytest -q -m "slow or not slow"

test-gpu: install
	$(PY) -m pytest -q -m gpu -rs

bench: install
	$(PY) -m bench.scheduler
	$(PY) -m bench.dispatch

clean:
	rm -rf $(VENV) .pytest_cache
