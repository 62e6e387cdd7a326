# Two commands for a newcomer: `make demo` and `make test`. Each sets itself up
# (virtualenv + install) on first use and is cheap afterwards.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRAS ?= train,onnx,dev
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup demo test bench clean

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

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
