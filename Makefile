# Two commands for a newcomer: `make demo` and `make test`. Each sets itself up
# (virtualenv + install) on first use and is cheap afterwards.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRAS ?= train,onnx,dev
# auto: install into VENV when it was not built from this pyproject.toml, constraints.txt and EXTRAS.
# no: use VENV as it is and never install into it (e.g. a virtualenv another clone built, as CI's quickstart test does).
INSTALL ?= auto
DEMO_ARGS ?=
PYTEST_ARGS ?=
# The stamp holds a checksum of what the install depends on, not a time: every file of a fresh clone is
# new, so a time stamp would reinstall into a virtualenv built from the very same files.
SETUP_KEY := $(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)-$(EXTRAS)
# Test workers (pytest-xdist): one per usable CPU (the affinity mask, e.g. taskset, and a container's CPU quota)
# where there are more than 2; none (one process) on 1 or 2 CPUs, where workers only compete for the cores. At most
# 16, and one per 2 GiB of memory (MemTotal, or a container's limit: each worker imports torch and ONNX Runtime and
# exports its own small bundles). The rule is hne_edge.limits.suite_workers (standard library only, so PYTHON runs
# it before any install). JOBS=0: one process.
JOBS ?= $(shell $(PYTHON) -c 'from hne_edge.limits import suite_workers; print(suite_workers())' 2>/dev/null || echo 0)
WORKERS := $(if $(filter-out 0,$(JOBS)),-n $(JOBS) --dist loadgroup)
# What demo and test import; INSTALL=no checks that VENV has them.
NEEDED := torch onnx onnxruntime sklearn matplotlib yaml click pytest pytest_timeout $(if $(WORKERS),xdist)

.PHONY: setup demo test test-fast bench gpu-acceptance clean

# The targets run `$(PY) -m ...` from this folder, so this checkout's code runs whichever virtualenv it is.
setup:
ifeq ($(INSTALL),no)
	@$(PY) -c 'import importlib.util as u, sys; m = [n for n in sys.argv[1:] if u.find_spec(n) is None]; m and sys.exit("make: INSTALL=no, but $(VENV) lacks " + ", ".join(m) + "; install them, or drop INSTALL=no")' $(NEEDED)
else
	@if [ "$$(cat $(STAMP) 2>/dev/null)" != "$(SETUP_KEY)" ]; then \
	  set -e; \
	  test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	  echo "$(PY) -m pip install -c constraints.txt -e '.[$(EXTRAS)]'"; \
	  $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]'; \
	  echo '$(SETUP_KEY)' > $(STAMP); \
	fi
endif

demo: setup
	$(PY) -m hne_edge demo $(DEMO_ARGS)

test: setup
	$(PY) -m pytest $(WORKERS) $(PYTEST_ARGS)

# The suite without the tests marked slow (end-to-end runs: demo, quickstart, device install, crash safety, ...);
# CI runs `make test`: everything.
test-fast: setup
	$(PY) -m pytest $(WORKERS) -m "not slow" $(PYTEST_ARGS)

# The runtime targets of BENCHMARKS.md (hne_resnet_small, ONNX Runtime CPU); see benchmarks/ for the others.
bench: setup
	$(PY) benchmarks/bench_runtime.py --out benchmarks/results/runtime_latest.md

# The GPU acceptance run (benchmarks/gpu_acceptance.py; BENCHMARKS.md says what it does): on a GPU machine as it is,
# with its own Python and nothing installed (such machines are often offline), 8 minutes at most.
GPU_PYTHON ?= python3
ACCEPTANCE_ARGS ?=
gpu-acceptance:
	PYTHONPATH=. $(GPU_PYTHON) benchmarks/gpu_acceptance.py $(ACCEPTANCE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
