# cmake/cpp.mk -- the C++ part of `make test`.
#
# Builds libmixprec with CMake, installs it into a prefix under build/, builds
# tests/cpp against that prefix with find_package(mixprec) and runs ctest.
# Incremental: the build folders are kept between runs (`make cpp-clean`
# removes them).
#
# From the Makefile:     include cmake/cpp.mk     (then depend on test-cpp)
# On its own:            make -f cmake/cpp.mk test-cpp PY=.venv/bin/python
#
# Inputs (make variables):
#   PY              Python interpreter with torch (required): gives torch's
#                   CMake package (torch.utils.cmake_prefix_path).
#   CPP_JOBS        parallel compile jobs (default 2)
#   CPP_CMAKE_ARGS  extra arguments for configuring libmixprec, e.g.
#                   -DMIXPREC_WITH_CUDA=OFF or -DTORCH_CUDA_ARCH_LIST=9.0
# The environment variables setup.py reads (MIXPREC_FORCE_CUDA,
# MIXPREC_FORCE_CPU, TORCH_CUDA_ARCH_LIST, CUDA_HOME) work here too.

# Being included must not change the including Makefile's default goal.
_CPP_SAVED_DEFAULT_GOAL := $(.DEFAULT_GOAL)

CPP_BUILD_DIR  ?= build/cmake
CPP_PREFIX     ?= build/cmake-install
CPP_TESTS_DIR  ?= build/cmake-tests
CPP_JOBS       ?= 2
CPP_CMAKE_ARGS ?=
CMAKE          ?= cmake
CTEST          ?= ctest
CPP_BUILD_TYPE ?= Release
# Ninja when installed (faster no-op rebuilds), else Makefiles. Used only when
# a build folder is first configured; an existing one keeps its generator.
CPP_GENERATOR  ?= $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)

_CPP_ROOT   := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/..)
_CPP_BUILD  := $(abspath $(CPP_BUILD_DIR))
_CPP_PREFIX := $(abspath $(CPP_PREFIX))
_CPP_TESTS  := $(abspath $(CPP_TESTS_DIR))

.PHONY: test-cpp cpp-lib cpp-install cpp-tests-build cpp-clean cpp-check-py

cpp-check-py:
	@if [ -z "$(PY)" ]; then \
	  echo "cmake/cpp.mk: set PY to a Python interpreter with torch (make test-cpp PY=.venv/bin/python)" >&2; \
	  exit 2; \
	fi
	@$(PY) -c 'import torch.utils' || { \
	  echo "cmake/cpp.mk: '$(PY)' cannot import torch" >&2; exit 2; }

# Configure (every run: cheap, and follows changes of PY / the environment)
# and build libmixprec.
cpp-lib: cpp-check-py
	@set -e; \
	torch_cmake="$$($(PY) -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"; \
	set -- -S "$(_CPP_ROOT)" -B "$(_CPP_BUILD)" \
	  -DCMAKE_BUILD_TYPE=$(CPP_BUILD_TYPE) \
	  -DCMAKE_PREFIX_PATH="$$torch_cmake" -DTorch_DIR="$$torch_cmake/Torch" \
	  -DCMAKE_INSTALL_PREFIX="$(_CPP_PREFIX)" -DMIXPREC_PIP_LAYOUT=OFF $(CPP_CMAKE_ARGS); \
	if [ -f "$(_CPP_BUILD)/CMakeCache.txt" ]; then \
	  $(CMAKE) "$$@"; \
	else \
	  $(CMAKE) -G "$(CPP_GENERATOR)" "$$@"; \
	fi; \
	$(CMAKE) --build "$(_CPP_BUILD)" -j $(CPP_JOBS)

cpp-install: cpp-lib
	$(CMAKE) --install "$(_CPP_BUILD)"

# The tests are a separate CMake project that finds the installed package.
cpp-tests-build: cpp-install
	@set -e; \
	torch_cmake="$$($(PY) -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"; \
	set -- -S "$(_CPP_ROOT)/tests/cpp" -B "$(_CPP_TESTS)" \
	  -DCMAKE_BUILD_TYPE=$(CPP_BUILD_TYPE) \
	  -DCMAKE_PREFIX_PATH="$(_CPP_PREFIX);$$torch_cmake" -DTorch_DIR="$$torch_cmake/Torch" \
	  -Dmixprec_DIR="$$(dirname "$$(find "$(_CPP_PREFIX)" -name mixprecConfig.cmake | head -n 1)")" \
	  -DMIXPREC_PYTHON="$(abspath $(PY))"; \
	if [ -f "$(_CPP_TESTS)/CMakeCache.txt" ]; then \
	  $(CMAKE) "$$@"; \
	else \
	  $(CMAKE) -G "$(CPP_GENERATOR)" "$$@"; \
	fi; \
	$(CMAKE) --build "$(_CPP_TESTS)" -j $(CPP_JOBS)

test-cpp: cpp-tests-build
	cd "$(_CPP_TESTS)" && $(CTEST) --output-on-failure

cpp-clean:
	rm -rf "$(_CPP_BUILD)" "$(_CPP_PREFIX)" "$(_CPP_TESTS)"

.DEFAULT_GOAL := $(_CPP_SAVED_DEFAULT_GOAL)
