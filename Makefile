# Two commands for a newcomer: `make demo` and `make test`. Each sets itself up
# (virtualenv + install) on first use and is cheap afterwards.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRAS ?= train,onnx,dev
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup demo test bench gpu-acceptance clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hne-edge demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The runtime targets of BENCHMARKS.md (hne_resnet_small, ONNX Runtime CPU); see benchmarks/ for the others.
bench: $(STAMP)
	$(PY) benchmarks/bench_runtime.py --out benchmarks/results/runtime_latest.md

# The GPU acceptance run (benchmarks/gpu_acceptance.py; BENCHMARKS.md says what it does): on a GPU machine as it is,
# with its own Python and nothing installed (such machines are often offline), 8 minutes at most.
GPU_PYTHON ?= python3
ACCEPTANCE_ARGS ?=
gpu-acceptance:
	PYTHONPATH=. $(GPU_PYTHON) benchmarks/gpu_acceptance.py $(ACCEPTANCE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
