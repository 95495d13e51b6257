# Quickstart targets. Each one installs what it needs into $(VENV) first.
#   make demo   run demo.py (eager, export with a dynamic batch, print, save/load)
#   make test   unit tests, docs build (warnings are errors), benchmark smoke runs
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchcond-installed
EXT_SOURCES := $(wildcard csrc/*.cpp csrc/*/*.cpp csrc/*/*.cu csrc/*/*.h csrc/*/*.cuh)

.PHONY: install demo test unit docs bench-smoke clean

install: $(STAMP)

$(STAMP): setup.py pyproject.toml requirements-dev.txt $(EXT_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-build-isolation -e .
	touch $(STAMP)

demo: install
	$(PY) demo.py

test: unit docs bench-smoke

unit: install
	$(PY) -m pytest -q

docs: install
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

bench-smoke: install
	$(PY) benchmarks/bench_eager.py --quick
	$(PY) benchmarks/bench_first_call.py --quick
	$(PY) benchmarks/bench_autograd.py --quick

clean:
	rm -rf build docs/_build docs/gallery torchcond/_C*.so *.egg-info
