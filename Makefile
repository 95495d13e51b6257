# Quickstart targets. Each one installs what it needs first: a virtual environment
# per torch version, kept between runs in $(VENV_CACHE), and torchcond._C built in
# place against that torch (object files per torch under build/, so switching back
# and forth only relinks).
#   make demo   run demo.py (eager, export with a dynamic batch, print, save/load)
#   make test   lint (ruff), CUDA kernel compile check, unit tests, the public API's types (mypy),
#               docs build (warnings are errors), benchmark smoke runs
#   make test-long  the hypothesis properties with 20x their examples, and the whole
#               composition matrix (test/test_composition.py; `make unit` runs a
#               fixed sample of it): hours on 2 cores (nightly)
#   make wheel-check  sdist -> wheel -> install outside the repo -> import, run the demo
#   make matrix what CI runs after `make test`: `unit`, `typecheck` and `docs` on
#               2.15.0 (what depends on torch's version), `unit` on 2.14.1 (a CPU-only
#               build) and 2.11.0
#   make cuda-check  compile csrc/cuda/select_kernel.cuh with nvcc (skipped without nvcc)
#   make bench  every CPU benchmark: JSON and PNG plots in benchmarks/results/ (~10 min)
#   make gpu-check  on a machine with a GPU: build the CUDA extension, the whole suite
#               on the GPU (big tensors included), compute-sanitizer memcheck over the
#               select kernels, the GPU benchmarks and plots into benchmarks/results/
#               (files named after the device). Without a GPU it says so and exits 0.
#               It uses $(PYTHON) as it is, with no venv and no pip (a machine without
#               a package registry): `make gpu-check PYTHON=python3`. Test modules
#               whose dependency is missing are skipped, naming it (tools/gpu_check.py).
# Another torch: `make test TORCH=2.14.1` (any release from 2.11 on), or a full pip
# requirement with TORCH_SPEC, e.g. TORCH_SPEC='torch==2.14.1' VENV=/some/venv.
PYTHON ?= python3
TORCH ?= 2.13.0
TORCH_SPEC ?= torch==$(TORCH)
VENV_CACHE ?= $(HOME)/.cache/torchcond/venvs
VENV ?= $(VENV_CACHE)/torch-$(TORCH)-$(shell $(PYTHON) -c 'import sys; print("py%d.%d" % sys.version_info[:2])')
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.torchcond-deps
MATRIX_FULL ?= 2.15.0
MATRIX_UNIT ?= 2.14.1 2.11.0
# Releases whose matrix leg builds the extension without CUDA: the CUDA build is
# checked by cuda-check and by the other legs.
MATRIX_CPU_ONLY ?= 2.14.1
# Test processes (pytest-xdist); each test file runs in one of them.
TEST_WORKERS ?= 2

.PHONY: install ext demo test lint format unit test-long typecheck docs bench-smoke bench cuda-check gpu-check wheel-check matrix clean

install: ext

# torch and the test/docs tools; redone when requirements-dev.txt changes. A machine-wide
# pip constraint may cap torch below the newest release; the matrix asks for exact
# releases, so the torch install ignores it.
$(DEPS_STAMP): requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	PIP_CONSTRAINT=/dev/null $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $(DEPS_STAMP)

# Always run: a no-op when torchcond._C is already built for this venv's torch, a
# relink after another torch built it, a compile after a source change. The .pth
# file makes this checkout importable from the venv, as an editable install would.
ext: $(DEPS_STAMP)
	$(PY) setup.py -q build_ext --inplace
	$(PY) -c 'import sysconfig; open(sysconfig.get_paths()["purelib"] + "/torchcond-checkout.pth", "w").write("$(CURDIR)\n")'

demo: install
	$(PY) demo.py

test: lint cuda-check unit typecheck docs bench-smoke

# Real consumers of exported programs (ExecuTorch, OpenVINO; test/test_portable.py), on the
# release ExecuTorch 1.5.1 is built for. There a missing consumer fails the tests
# (TORCHCOND_REQUIRE_CONSUMERS=1); other releases skip them, named.
CONSUMERS_TORCH ?= 2.13.0
CONSUMERS_STAMP := $(VENV)/.torchcond-consumers
CONSUMERS := $(if $(filter $(TORCH),$(CONSUMERS_TORCH)),$(CONSUMERS_STAMP))

$(CONSUMERS_STAMP): requirements-consumers.txt $(DEPS_STAMP)
	PIP_CONSTRAINT=/dev/null $(PY) -m pip install -q -r requirements-consumers.txt "$(TORCH_SPEC)"
	touch $(CONSUMERS_STAMP)

unit: install $(CONSUMERS)
	$(if $(CONSUMERS),TORCHCOND_REQUIRE_CONSUMERS=1) $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

# ruff's linter and formatter, configured in pyproject.toml (`make format` applies
# what `lint` asks for), no private torch name outside torchcond/_compat/, and
# torchcond's own imports one-way (no cycle; _compat imports nothing above it).
lint: $(DEPS_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) tools/check_private_torch.py torchcond
	$(PY) tools/check_imports.py torchcond

format: $(DEPS_STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Nightly-style: the hypothesis properties with EXAMPLES_SCALE times their examples
# (cond/switch against a Python `if` over pytrees, dtypes, layouts with equal dims,
# in-place branches under select and vmap, grad-mode and custom-Function branches,
# branches that draw random numbers), and with TORCHCOND_COMPOSITION=full every case
# of the composition matrix (torch.func transforms and their pairs x make_fx, export,
# compile x branch kinds x cond/switch x strategies, against a Python `if`).
EXAMPLES_SCALE ?= 20
test-long: install
	TORCHCOND_EXAMPLES_SCALE=$(EXAMPLES_SCALE) TORCHCOND_COMPOSITION=full $(PY) -m pytest -q -p no:cacheprovider test/test_properties.py test/test_autograd_properties.py test/test_composition.py

# mypy over the package, and over the public API as a user sees it: inferred return
# types, Literal strategies, and the mistakes it must flag (test/typing/public_api.py;
# an unused ignore is an error). Configured in pyproject.toml.
typecheck: install
	$(PY) -m mypy --cache-dir build/mypy-$(TORCH)

# The HTML pages, then every example in them (the .rst pages' testcode/doctest blocks
# and the docstrings' Examples) run by sphinx.ext.doctest. -n: every cross-reference
# must resolve (intersphinx reads the committed docs/_inventories/*.inv, no network).
# Open docs/_build/html/index.html.
docs: install
	$(PY) -m sphinx -n -W --keep-going -q -b html docs docs/_build/html
	$(PY) -m sphinx -n -W --keep-going -q -b doctest docs docs/_build/doctest

# Every CPU benchmark with --quick through the entry point, plots included, into
# build/bench-smoke (benchmarks/results/ keeps the full run's figures), two at a time.
bench-smoke: install
	$(PY) -m benchmarks --quick --jobs 2 --out-dir build/bench-smoke-$(TORCH)

# The full CPU benchmarks (`python -m benchmarks`): results/<name>.json, plots, run.json.
bench: install
	$(PY) -m benchmarks

# The CUDA select kernel compiles with nvcc alone (no CUDA torch needed): CI has no
# GPU and a CPU torch, so this is how the kernel stays compilable there. ptxas
# warnings (register spills, local memory) fail the check. One nvcc thread per core
# (an architecture each).
NVCC ?= $(shell if [ -x /usr/local/cuda/bin/nvcc ]; then echo /usr/local/cuda/bin/nvcc; else command -v nvcc; fi)
CUDA_CHECK_ARCHS ?= 80 90

cuda-check:
	@if [ -z "$(NVCC)" ]; then \
		echo "cuda-check: skipped: nvcc not found (looked for /usr/local/cuda/bin/nvcc and nvcc on PATH)"; \
	else \
		out=$$(mktemp -d) && \
		echo "cuda-check: $(NVCC) csrc/cuda/select_kernel_check.cu for sm_$(subst $(eval) ,/sm_,$(CUDA_CHECK_ARCHS))" && \
		$(NVCC) -std=c++17 -O3 --threads 0 -c csrc/cuda/select_kernel_check.cu -o $$out/select_kernel_check.o \
			$(foreach a,$(CUDA_CHECK_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
			-Xptxas --warn-on-spills,--warn-on-local-memory-usage,--warning-as-error && \
		rm -rf $$out && echo "cuda-check: ok"; \
	fi

# Every step needs the GPU, so none runs in `make test`. GPU_CHECK_STEPS picks steps
# (build,suite,memcheck,bench; a warm machine keeps the build between calls);
# GPU_CHECK_OUT=DIR also writes gpu-check.txt and gpu-check.tar.gz (logs and this
# run's results) there, e.g. $$OUT on the device machine; DRY_RUN=1 prints the commands.
GPU_CHECK_STEPS ?= build,suite,memcheck,bench
GPU_CHECK_RESULTS ?= benchmarks/results
GPU_CHECK_OUT ?=
gpu-check:
	@$(PYTHON) tools/gpu_check.py --steps $(GPU_CHECK_STEPS) --results $(GPU_CHECK_RESULTS) \
		$(if $(GPU_CHECK_OUT),--out $(GPU_CHECK_OUT)) $(if $(DRY_RUN),--dry-run)

# What a user of a release gets: an sdist, a wheel built from it (not from this
# checkout) against this venv's torch, installed with its dependencies (the torch
# release it pins) into a bare venv outside the repository, where it is imported and
# runs the demo. A few minutes: it compiles the extension again and installs torch.
DIST ?= $(or $(TMPDIR),/tmp)/torchcond-wheel-check
wheel-check: install
	rm -rf $(DIST) && mkdir -p $(DIST)
	$(PY) -m build --sdist --no-isolation -o $(DIST) .
	$(PY) -m pip wheel -q --no-build-isolation --no-deps -w $(DIST) $(DIST)/torchcond-*.tar.gz
	$(PYTHON) -m venv $(DIST)/venv
	$(DIST)/venv/bin/python -m pip install -q $(DIST)/torchcond-*.whl
	cp demo.py $(DIST)/demo.py
	cd $(DIST) && venv/bin/python -P -c 'import torch, torchcond, os; \
		assert torchcond.__file__.startswith(os.getcwd()), torchcond.__file__; \
		x = torch.tensor([1.0, -2.0]); \
		assert torch.equal(torchcond.cond(x.sum() > 0, torch.neg, torch.abs, (x,), strategy="select"), x.abs()); \
		print("wheel-check: torchcond", torchcond.__version__, "from", os.path.dirname(torchcond.__file__), "ok")'
	cd $(DIST) && venv/bin/python -P demo.py > demo.out && tail -n 3 demo.out

# CI's torch matrix after `make test` (torch 2.13.0). Lint, cuda-check and the
# benchmark smoke runs do not depend on torch's version, so they run there only. Each
# leg prints its time.
matrix:
	@for v in $(MATRIX_FULL); do \
		start=$$(date +%s); $(MAKE) --no-print-directory unit typecheck docs TORCH=$$v || exit 1; \
		echo "matrix: torch $$v: make unit typecheck docs passed in $$(( $$(date +%s) - start )) s"; \
	done
	@for v in $(MATRIX_UNIT); do \
		start=$$(date +%s); \
		cuda=$$(case " $(MATRIX_CPU_ONLY) " in *" $$v "*) echo 0;; *) echo "$${TORCHCOND_CUDA:-}";; esac); \
		TORCHCOND_CUDA=$$cuda $(MAKE) --no-print-directory unit TORCH=$$v || exit 1; \
		echo "matrix: torch $$v: make unit passed in $$(( $$(date +%s) - start )) s"; \
	done

clean:
	rm -rf build docs/_build docs/gallery torchcond/_C*.so torchcond/_build_info.json *.egg-info
