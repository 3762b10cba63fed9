# make build: AOT-compile every kernel variant (sm80 + sm90) and build the wheel in dist/.
# make test:  the build-time tests (need Triton), then install the wheel into a clean
#             environment without Triton and run the runtime tests (CPU tests
#             everywhere, GPU tests where a GPU is present), then the GPU tests
#             once more with GG_RUNTIME_FORCE_PTX=1 (the sm80 PTX path) where a
#             GPU is present.
# make bench: run bench/ on a GPU machine (writes bench/results/).
# make clean: remove every build output and environment made here.
#
# Environments: if $(PYTHON) already has triton==3.6.0, torch, pybind11, setuptools,
# wheel and click (as on the GPU machines, which have no network), it builds;
# otherwise .venv-build is created from PyPI with $(TORCH_SPEC).  The torch of the
# build is the one gg_runtime._torch_C (tensors read in C++) is built for.  The
# test environment .venv-test is made by tests/make_test_env.py: $(PYTHON)'s own
# packages minus Triton when it has torch, else $(TORCH_SPEC) from PyPI.

PYTHON ?= python3
TRITON_VERSION := 3.6.0
TORCH_SPEC ?= torch==2.13.0
BUILD_VENV := .venv-build
TEST_VENV := .venv-test
AOT_DIR := build/aot/kernels
JOBS ?= $(shell nproc)

BUILD_CHECK := import triton, torch, pybind11, setuptools, wheel, click; assert triton.__version__ == '$(TRITON_VERSION)'
BUILD_PY = $(shell $(PYTHON) -c "$(BUILD_CHECK)" 2>/dev/null && echo $(PYTHON) || echo $(BUILD_VENV)/bin/python)
TEST_PY := $(TEST_VENV)/bin/python
HAS_GPU := import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)

.PHONY: build test bench clean build-env test-env

build: build-env
	$(BUILD_PY) -m aot build --out build/aot --jobs $(JOBS) --keep-ptx
	rm -rf dist build/lib.* build/bdist.*  # stale copies of removed modules would ship
	GG_AOT_DIR=$(AOT_DIR) $(BUILD_PY) -m pip wheel --no-build-isolation --no-deps -w dist . -q
	$(BUILD_PY) -m aot manylinux dist/gg_runtime-*.whl
	@ls -l dist/*.whl

build-env:
	@if [ "$(BUILD_PY)" = "$(BUILD_VENV)/bin/python" ] && ! $(BUILD_VENV)/bin/python -c "$(BUILD_CHECK)" 2>/dev/null; then \
	  echo "making $(BUILD_VENV) (triton==$(TRITON_VERSION), $(TORCH_SPEC), pybind11, click)"; \
	  { [ -x $(BUILD_VENV)/bin/python ] || $(PYTHON) -m venv $(BUILD_VENV); } && \
	  $(BUILD_VENV)/bin/pip install -q "triton==$(TRITON_VERSION)" "$(TORCH_SPEC)" pybind11 "setuptools>=64" wheel click pytest auditwheel; \
	fi

test: build-env test-env
	@ls dist/gg_runtime-*.whl >/dev/null 2>&1 || { echo "no wheel in dist/: run make build"; exit 1; }
	$(PYTHON) -m pip install -q --no-deps --no-index --upgrade --target \
	  "$$($(TEST_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" dist/gg_runtime-*.whl
	$(BUILD_PY) -m pytest -q tests/aot
	cd tests/runtime && GG_WHEEL="$$(ls ../../dist/gg_runtime-*.whl)" ../../$(TEST_PY) -m pytest -q .
	@if $(TEST_PY) -c "$(HAS_GPU)"; then \
	  echo "GPU tests again, on the sm80 PTX compiled by the driver (GG_RUNTIME_FORCE_PTX=1):"; \
	  cd tests/runtime && GG_RUNTIME_FORCE_PTX=1 ../../$(TEST_PY) -m pytest -q test_gpu_*.py; \
	else echo "no GPU here: the sm80 PTX pass of the GPU tests is skipped"; fi

test-env:
	$(PYTHON) tests/make_test_env.py $(TEST_VENV) "$(TORCH_SPEC)"

bench:
	rm -rf build/bench-site
	$(PYTHON) -m pip install -q --no-deps --no-index --target build/bench-site dist/gg_runtime-*.whl
	PYTHONPATH=build/bench-site $(PYTHON) bench/run.py

clean:
	rm -rf build dist *.egg-info $(BUILD_VENV) $(TEST_VENV)
