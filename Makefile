# Quickstart targets. Each one installs what it needs into $(VENV) first.
#   make demo   run demo.py (eager, export with a dynamic batch, print, save/load)
#   make test   CUDA kernel compile check, unit tests, docs build (warnings are errors),
#               benchmark smoke runs
#   make cuda-check  compile csrc/cuda/select_kernel.cuh with nvcc (skipped without nvcc)
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchcond-installed
EXT_SOURCES := $(wildcard csrc/*.cpp csrc/*.h csrc/*/*.cpp csrc/*/*.cu csrc/*/*.h csrc/*/*.cuh)

.PHONY: install demo test unit docs bench-smoke cuda-check clean

install: $(STAMP)

$(STAMP): setup.py pyproject.toml requirements-dev.txt $(EXT_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-build-isolation -e .
	touch $(STAMP)

demo: install
	$(PY) demo.py

test: cuda-check unit docs bench-smoke

unit: install
	$(PY) -m pytest -q

docs: install
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

bench-smoke: install
	$(PY) benchmarks/bench_eager.py --quick
	$(PY) benchmarks/bench_first_call.py --quick
	$(PY) benchmarks/bench_autograd.py --quick
	$(PY) benchmarks/bench_select.py --quick
	$(PY) benchmarks/bench_compile.py --quick

# The CUDA select kernel compiles with nvcc alone (no CUDA torch needed): CI has no
# GPU and a CPU torch, so this is how the kernel stays compilable there. ptxas
# warnings (register spills, local memory) fail the check. A few seconds.
NVCC ?= $(shell if [ -x /usr/local/cuda/bin/nvcc ]; then echo /usr/local/cuda/bin/nvcc; else command -v nvcc; fi)
CUDA_CHECK_ARCHS ?= 80 90

cuda-check:
	@if [ -z "$(NVCC)" ]; then \
		echo "cuda-check: skipped: nvcc not found (looked for /usr/local/cuda/bin/nvcc and nvcc on PATH)"; \
	else \
		out=$$(mktemp -d) && \
		echo "cuda-check: $(NVCC) csrc/cuda/select_kernel_check.cu for sm_$(subst $(eval) ,/sm_,$(CUDA_CHECK_ARCHS))" && \
		$(NVCC) -std=c++17 -O3 -c csrc/cuda/select_kernel_check.cu -o $$out/select_kernel_check.o \
			$(foreach a,$(CUDA_CHECK_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
			-Xptxas --warn-on-spills,--warn-on-local-memory-usage,--warning-as-error && \
		rm -rf $$out && echo "cuda-check: ok"; \
	fi

clean:
	rm -rf build docs/_build docs/gallery torchcond/_C*.so *.egg-info
