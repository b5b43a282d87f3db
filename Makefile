# mixprec — the two commands of the README:
#   make demo    bootstrap .venv, build, run the example training job
#   make test    bootstrap .venv, build the op libraries once (stable ABI), run the Python
#                suite with .venv's torch and with a CPU torch (2.13.0+cpu, its own venv),
#                the ABI gates, the C++ (ctest) suite, and the GPU check's CPU smoke run
# With PYTHON=/path/to/python an existing interpreter that already has torch is used
# instead of .venv (e.g. on a GPU machine without network).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?=
TORCH_VERSION ?= 2.14.1
VENV ?= .venv
ROOT := $(abspath .)
export MAX_JOBS ?= 2

ifeq ($(strip $(PYTHON)),)
PY := $(ROOT)/$(VENV)/bin/python
ENV_TARGET := $(VENV)/.mixprec-env
else
PY := $(PYTHON)
ENV_TARGET := python-env
endif

PYTEST_ARGS ?=

# A checkout's build always carries the test-only library mixprec/_cuda_emulation
# (csrc/cuda_emulation: the CUDA launchers run on the CPU), so that `make demo` and
# `make test` share one build; wheels and plain installs leave it out.
export MIXPREC_BUILD_TEST_EXT := 1

.PHONY: help env python-env build demo test test-python test-python-cpu-torch abi-gates \
        wheel test-wheel test-cpp test-isa lint format bench clean gpu-peers torch-optim-suite

help:
	@echo "make demo     bootstrap .venv (torch $(TORCH_VERSION)), build, run the demo"
	@echo "make test     build once, run the Python suites (.venv's torch and a CPU torch), the"
	@echo "              ABI gates and the C++ suite"
	@echo "make wheel    the release wheel (CPU and CUDA kernels, py3-none-manylinux) in dist/, gated"
	@echo "make test-wheel  that wheel's suite with torch $(MATRIX_TORCHES)"
	@echo "make bench    run the benchmarks (figures: benchmarks/README.md)"
	@echo "make torch-optim-suite  torch's own test_optim.py against mixprec's Adam, AdamW, SGD"
	@echo "PYTHON=...    use that interpreter (with torch) instead of .venv"

# --- environment -----------------------------------------------------------------------
$(VENV)/.mixprec-env: requirements-dev.txt requirements-frameworks.txt
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(VENV)/bin/python -m pip install --quiet -r requirements-dev.txt -r requirements-frameworks.txt
	@touch $@

python-env:
	@$(PY) -c "import torch; print('using', '$(PY)', 'torch', torch.__version__)" || \
	  { echo "PYTHON=$(PY) cannot import torch"; exit 1; }
	@$(PY) -c "import pytest, hypothesis, numpy" 2>/dev/null || \
	  $(PY) -m pip install --quiet -r requirements-dev.txt || \
	  echo "warning: could not install requirements-dev.txt into $(PY)"
	@$(PY) -c "import transformers, accelerate, lightning" 2>/dev/null || \
	  $(PY) -m pip install --quiet -r requirements-frameworks.txt || \
	  echo "warning: could not install requirements-frameworks.txt into $(PY) (tests/frameworks/ will skip)"

env: $(ENV_TARGET)

# --- build -----------------------------------------------------------------------------
# Editable install of the default configuration: CUDA kernels when torch is a CUDA build
# and nvcc is found (MIXPREC_FORCE_CUDA=1 / MIXPREC_FORCE_CPU=1 override). pip rebuilds
# from scratch, so the install is redone only when a C++ source or the build files change,
# or for another interpreter / FORCE setting (the stamp's name).
NATIVE_SOURCES := $(shell find csrc -type f) setup.py pyproject.toml
EDITABLE_STAMP := build/.editable-$(shell printf '%s|%s|%s|%s' '$(PY)' '$(MIXPREC_FORCE_CUDA)' \
  '$(MIXPREC_FORCE_CPU)' '$(TORCH_CUDA_ARCH_LIST)' | md5sum | cut -c1-12)

$(EDITABLE_STAMP): $(NATIVE_SOURCES) | env
	$(PY) -m pip install --no-build-isolation --no-deps --quiet -e .
	@mkdir -p build && touch $@

build: env $(EDITABLE_STAMP)
	$(PY) -m mixprec.info

# --- run -------------------------------------------------------------------------------
demo: build
	$(PY) examples/train_digits.py

test-python: build
	env $${MIXPREC_FORCE_CUDA:+MIXPREC_EXPECT_CUDA_KERNELS=1} $(PY) -m pytest tests $(PYTEST_ARGS)

# The same build loaded into a CPU torch (CPU_TORCH, from the machine's wheel store, in its
# own venv with the test dependencies only): the op libraries are built on torch's stable
# ABI (2.11), so this replaces a second, CPU-only build. tests/frameworks/, tests/project/
# and tests/cpp/ run once, in test-python (tools/torch_matrix.py).
CPU_TORCH ?= 2.13.0
test-python-cpu-torch: build
	MIXPREC_EXPECT_CUDA_KERNELS=0 $(PY) tools/torch_matrix.py --package python/mixprec \
	  $(CPU_TORCH) -- $(PYTEST_ARGS)

# The gates every build of the op libraries passes to load into torch 2.11 and newer
# (stable shims only, each exported by torch 2.11; no SLEEF, Python or torch C++ symbols;
# tools/abi_gates.py): on the checkout's build here, on the wheel in `make wheel`.
abi-gates: build
	PATH="$(dir $(PY)):$$PATH" $(PY) tools/abi_gates.py python/mixprec

# The release wheel: CUDA kernels (WHEEL_ARCHS, CUDA 13.0: serves cu130 and cu132 torch) and
# the CPU kernels in one py3-none wheel for every torch from 2.11 on, built in its own
# folders (the checkout's build stays), repaired by auditwheel (torch's and CUDA's libraries
# excluded: they come with torch) to manylinux_2_28 (csrc/compat/ keeps newer glibc and
# libstdc++ symbol versions out), and gated (tools/abi_gates.py).
WHEEL_ARCHS ?= 8.0;9.0;10.0+PTX
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' python/mixprec/_version.py)
WHEEL := dist/mixprec-$(VERSION)-py3-none-*manylinux_2_28_x86_64.whl
wheel: env
	rm -rf build/wheel dist/mixprec-$(VERSION)-*.whl
	MIXPREC_BUILD_TEST_EXT= MIXPREC_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$(WHEEL_ARCHS)" \
	  $(PY) setup.py --quiet build --build-base build/wheel \
	  bdist_wheel --bdist-dir build/wheel/bdist --dist-dir build/wheel/raw
	PATH="$(dir $(PY)):$$PATH" $(PY) -m auditwheel repair --exclude 'libtorch*.so' --exclude 'libc10*.so' \
	  --exclude 'libcudart.so.*' --plat manylinux_2_28_x86_64 -w dist build/wheel/raw/mixprec-*.whl
	PATH="$(dir $(PY)):$$PATH" $(PY) tools/abi_gates.py $(WHEEL)

# The wheel's suite in a fresh venv per torch of the matrix (tools/torch_matrix.py; the
# newer releases come from PyPI, a CUDA build each: several GB and minutes per venv).
MATRIX_TORCHES ?= 2.11.0 2.13.0 2.14.1 2.15.0
test-wheel: wheel
	$(PY) tools/torch_matrix.py --package $(WHEEL) \
	  $(MATRIX_TORCHES) -- $(PYTEST_ARGS)

# The CPU kernels are picked by the CPU: mixprec's per ISA (MIXPREC_CPU_CAPABILITY caps
# them) and torch's, which the references and torch.optim run on (ATEN_CPU_CAPABILITY).
# test-python covers this machine's; test-isa reruns the suites of the CPU span kernels
# (fused optimizers, unscale, norms) with both capped to each lower set, so an AVX-512
# machine also checks AVX2 and the baseline. torch.compile tests are left out: they test
# graph capture, which no ISA changes, and inductor's on-disk cache (keyed without
# ATEN_CPU_CAPABILITY) hands back AVX2 code that fails to build under `default`.
ISA_TESTS := tests/ops/test_optim_ops.py tests/optim/test_optim_classes.py tests/ops/test_unscale.py \
  tests/ops/test_norm.py tests/ops/test_quant8_kernels.py

test-isa: build
	@caps=$$($(PY) -c "import torch, mixprec; o = ['default', 'avx2', 'avx512']; \
	  n = [torch.backends.cpu.get_cpu_capability().lower(), \
	       mixprec.build_info().get('cpu_capability', 'default')]; \
	  print(' '.join(o[:max(o.index(c) if c in o else 0 for c in n)]))"); \
	[ -n "$$caps" ] || echo "test-isa: no CPU kernel set below this machine's"; \
	for cap in $$caps; do \
	  echo "== ATEN_CPU_CAPABILITY=$$cap MIXPREC_CPU_CAPABILITY=$$cap"; \
	  ATEN_CPU_CAPABILITY=$$cap MIXPREC_CPU_CAPABILITY=$$cap $(PY) -m pytest $(ISA_TESTS) \
	    -q -p no:cacheprovider -k "not cuda and not compile" $(PYTEST_ARGS) || exit 1; \
	done

-include cmake/cpp.mk

test: test-python test-python-cpu-torch abi-gates test-cpp test-isa gpu-check-smoke

# C++ sources clang-format checks (.clang-format); `make format` rewrites them in place
CPP_FORMAT_FILES = $(shell git ls-files 'csrc/*.h' 'csrc/*.cpp' 'csrc/*.cu' 'csrc/*.cuh' \
  'tests/cpp/*.h' 'tests/cpp/*.cpp' 'examples/cpp/*.cpp')
CLANG_FORMAT = $(PY) -c "import sys, clang_format; sys.argv[0] = 'clang-format'; \
  clang_format.clang_format()"

lint: env
	$(PY) -m ruff check python tests benchmarks examples tools
	$(CLANG_FORMAT) --dry-run --Werror $(CPP_FORMAT_FILES)

format: env
	$(CLANG_FORMAT) -i $(CPP_FORMAT_FILES)

bench: build
	$(PY) benchmarks/bench_unscale.py

# torch's own optimizer suite (test/test_optim.py of the installed torch's version, fetched
# from pytorch's sources into TORCH_OPTIM_TEST: it is in neither the wheel nor this
# repository) against torch's and mixprec's Adam, AdamW and SGD (tools/torch_optim_suite.py);
# the tally per test in build/torch_optim_suite/report.md.
TORCH_OPTIM_TEST ?= build/torch_tests/test_optim.py
TORCH_OPTIM_SUITE_ARGS ?=
torch-optim-suite: build
	@test -f "$(TORCH_OPTIM_TEST)" || { echo "make torch-optim-suite: no $(TORCH_OPTIM_TEST);" \
	  "put torch $$($(PY) -c 'import torch; print(torch.__version__)')'s test/test_optim.py" \
	  "there (or give TORCH_OPTIM_TEST=...)" >&2; exit 2; }
	PYTHONPATH=python $(PY) tools/torch_optim_suite.py $(TORCH_OPTIM_TEST) \
	  --side torch --side mixprec --out build/torch_optim_suite \
	  --report build/torch_optim_suite/report.md $(TORCH_OPTIM_SUITE_ARGS)

# On a GPU machine without network: install the carried wheel (dist/*.whl; none: build from
# source), refuse it if it was built at another commit (--allow-other-commit), then the open
# GPU items in priority order, each in its own time limit and process group, skipping what
# no longer fits the budget (420 s: a warm second call of 240 s still fits one allotment);
# summary.md, times.json and one log per part in $$OUT or build/gpu-check (tools/gpu_check.py,
# docs/gpu_check.md). Without make: python3 tools/gpu_check.py --python python3. Give the
# interpreter that has torch:    make gpu-check PYTHON=/path/to/python
#   GPU_CHECK_ARGS=--plan        what it would run, expected times and their sources
#   GPU_CHECK_ARGS=--cpu-smoke   the parts that can, on CPU at tiny sizes (a step of `make test`)
#   GPU_CHECK_ARGS='--only e2e,capture-speed --budget-s 240'   the warm second call
GPU_CHECK_ARGS ?=
.PHONY: gpu-check gpu-check-smoke
gpu-check:
	@command -v "$(PY)" >/dev/null || { echo "make gpu-check: '$(PY)' not found; give the" \
	  "interpreter that has torch: make gpu-check PYTHON=/path/to/python" >&2; exit 2; }
	$(PY) tools/gpu_check.py --python "$(PY)" $(GPU_CHECK_ARGS)

gpu-check-smoke: build
	$(PY) tools/gpu_check.py --python "$(PY)" --cpu-smoke --out build/gpu-check-smoke

# The libraries bench_optim.py sets the 8-bit optimizers beside (torchao, bitsandbytes), for a
# GPU machine without network: installed here, for its Python (3.12, x86-64), into
# .gpu_peers/, which gpu_check.py then puts on PYTHONPATH. Carry .gpu_peers to that machine:
# gpu-check's fp8 part needs torchao (SKIP without it), its bench part uses both.
# Only bitsandbytes' CUDA 13.0 and CPU libraries are kept (about 30 MB in all).
GPU_PEERS_PYTHON ?= 3.12
TORCHAO_VERSION ?= 0.18.0
BITSANDBYTES_VERSION ?= 0.50.2
.PHONY: gpu-peers
gpu-peers: env
	rm -rf .gpu_peers
	$(PY) -m pip install --quiet --no-deps --only-binary=:all: --implementation cp \
	  --python-version $(GPU_PEERS_PYTHON) --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --target .gpu_peers \
	  "torchao==$(TORCHAO_VERSION)" "bitsandbytes==$(BITSANDBYTES_VERSION)"
	find .gpu_peers/bitsandbytes -name 'libbitsandbytes_*.so' ! -name '*_cuda130.so' \
	  ! -name '*_cpu.so' -delete
	rm -rf .gpu_peers/test
	@du -sh .gpu_peers

clean:
	rm -rf build dist python/*.egg-info python/mixprec/_ops*.so python/mixprec/_cuda_emulation*.so \
	  python/mixprec/_cpp demo_report.png
