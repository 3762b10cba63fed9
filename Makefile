# make build: AOT-compile every kernel variant (sm80 + sm90; make kernels, skipped where
#             build/aot/kernels already holds them, compiled elsewhere from these sources
#             by the pinned Triton) and build the wheel in dist/.
# make test:  the style checks (ruff, clang-format; where the compiler's environment has
#             them) and the build-time tests (need the pinned Triton: skipped, and said,
#             where there is none, the kernels having been compiled elsewhere), then
#             install the wheel into a clean environment without Triton and run the
#             runtime tests (CPU tests everywhere, GPU tests where a GPU is present) and
#             the benchmark report's tests (tests/bench, CPU), then, where a GPU is
#             present, the GPU tests once more with GG_RUNTIME_FORCE_PTX=1 (the sm80 PTX
#             path) and once with GG_TEST_SM_LIMIT=3 (every persistent program walks
#             many tiles: tests/runtime/conftest.py).
# make bench: run the benchmark (python -m bench.run) on a GPU machine, in the build's
#             environment (the one with torch), against the wheel installed apart
#             (make bench-site); it updates bench/results.json and bench/RESULTS.md.
#             BENCH_ARGS passes it arguments: make bench BENCH_ARGS="--sections host".
# make test-torch TORCH_SPEC=torch==X: the runtime tests of that wheel under torch X from
#             the package index, in its own environment (.venv-torch-X); CI runs it for
#             the oldest and the newest torch the wheel's metadata allows
#             (make test-torch-range).
# make kernels-check: one variant of each kernel code path compiled with Triton 3.6 (its
#             own environment, .venv-aot-3.6.0), nothing kept: CI's check that the
#             sources still compile under the Triton docs/build.md names besides the pin.
# make memcheck: (GPU machine, compute-sanitizer) the GPU tests and the bench's checks under
#             NVIDIA's compute-sanitizer against the wheel (tests/memcheck.py): memcheck with
#             exact allocations, initcheck on a few tests, racecheck and synccheck on the
#             warp-specialised kernels; one summary line per tool, the reports in build/memcheck.
#             MEMCHECK_ARGS passes it arguments: --tools memcheck --files 'test_gpu_moe*'.
# make docs:  the documentation (docs/, mkdocs.yml: the API reference from the docstrings,
#             guides, design, dated notes), built with --strict into build/docs in its own
#             environment (.venv-docs, docs/requirements.txt); a broken link or reference
#             fails it.  Needs neither the wheel nor torch nor a GPU.
# make clean: remove every build output and environment made here.
#
# Environments, two for the build, so that no torch release can conflict with the
# pinned kernel compiler (torch pins its own Triton):
# - the kernel compiler (AOT step, build-time tests): $(PYTHON) if it already has
#   triton==$(TRITON_VERSION), click, pytest and wheel (as on the GPU machines, which have no
#   network), else .venv-aot made from the package index;
# - the extensions (setup.py: pybind11, the torch operators on torch's stable ABI):
#   $(PYTHON) if it has torch, pybind11, setuptools and wheel, else .venv-build with
#   $(TORCH_SPEC).  Only that torch's headers matter: the operators are compiled for
#   the oldest torch the wheel allows (setup.py) and load under every later one.
# The test environment .venv-test is made by tests/make_test_env.py: the build
# environment's packages minus Triton when it has torch, click and pytest, else
# $(TORCH_SPEC) from the package index (whose torch may bring Triton: the runtime neither
# needs nor loads it, tested).

PYTHON ?= python3
TRITON_VERSION := 3.9.0
TORCH_SPEC ?= torch==2.13.0
# The torch range the wheel's Requires-Dist states (setup.py), tested by make test-torch-range.
OLDEST_TORCH := torch==2.10.0
NEWEST_TORCH := torch==2.15.0
AOT_VENV := .venv-aot
BUILD_VENV := .venv-build
TEST_VENV := .venv-test
AOT_DIR := build/aot/kernels
JOBS ?= $(shell nproc)

AOT_CHECK := import triton, click, pytest, wheel; assert triton.__version__ == '$(TRITON_VERSION)'
BUILD_CHECK := import torch, pybind11, setuptools, wheel
AOT_PY = $(shell $(PYTHON) -c "$(AOT_CHECK)" 2>/dev/null && echo $(PYTHON) || echo $(AOT_VENV)/bin/python)
BUILD_PY = $(shell $(PYTHON) -c "$(BUILD_CHECK)" 2>/dev/null && echo $(PYTHON) || echo $(BUILD_VENV)/bin/python)
TEST_PY := $(TEST_VENV)/bin/python
HAS_GPU := import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)

.PHONY: build current-kernels kernels kernels-check test memcheck bench bench-site docs clean build-env aot-env ext-env \
	test-env test-torch test-torch-range lint

# Style tools, pinned (their rules and output change between releases); installed with
# the kernel compiler's environment where make creates it.
LINT_PACKAGES := ruff==0.17.6 clang-format==23.1.5
LINT_BIN = $(dir $(AOT_PY))
CXX_SOURCES = csrc/*.cc csrc/*.h csrc/ops/*.cc csrc/ops/*.h

# venv: install the wheel into that environment's site-packages (no dependencies:
# the environment has them).
define install_wheel
	$(PYTHON) -m pip install -q --no-deps --no-index --upgrade --target \
	  "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
	  dist/gg_runtime-*.whl
endef
# venv: the runtime tests against the wheel installed there.
define runtime_tests
	cd tests/runtime && GG_WHEEL="$$(ls ../../dist/gg_runtime-*.whl)" ../../$(1)/bin/python -m pytest -q .
endef
WHEEL_CHECK := @ls dist/gg_runtime-*.whl >/dev/null 2>&1 || { echo "no wheel in dist/: run make build"; exit 1; }

# torch's download (ext-env) is network-bound: it runs beside the kernels' compilation.
build:
	@$(MAKE) --no-print-directory -j2 --output-sync=none ext-env current-kernels
	rm -rf dist build/lib.* build/bdist.*  # stale copies of removed modules would ship
	@echo "building the extensions (C++, a file a core at once) and the wheel"
	GG_AOT_DIR=$(AOT_DIR) $(BUILD_PY) -m pip wheel --no-build-isolation --no-deps -w dist . -q
	$(BUILD_PY) -m aot.manylinux dist/gg_runtime-*.whl
	@ls -l dist/*.whl

current-kernels:
	@$(PYTHON) -m aot.prebuilt $(AOT_DIR) $(TRITON_VERSION) || $(MAKE) kernels

# Compile every kernel variant with the pinned Triton.  make build skips this where
# $(AOT_DIR) already holds kernels that Triton compiled from these sources
# (aot/prebuilt.py): compiled on another machine and copied here, as on a GPU machine
# without network and without the pinned Triton.
kernels: aot-env
	$(AOT_PY) -m aot build --out build/aot --jobs $(JOBS) --keep-ptx

# The other Triton the sources compile under (docs/build.md; torch 2.11's, on GPU machines
# without network): one variant of each code path compiled with it, in its own environment,
# nothing kept.
CHECKED_TRITON := 3.6.0
CHECK_VENV := .venv-aot-$(CHECKED_TRITON)
CHECKED_ENV := import triton, click; assert triton.__version__ == '$(CHECKED_TRITON)'
kernels-check:
	$(call make_env,$(CHECK_VENV)/bin/python,$(CHECK_VENV),$(CHECKED_ENV),"triton==$(CHECKED_TRITON)" click)
	$(CHECK_VENV)/bin/python -m aot build --out build/aot-$(CHECKED_TRITON) --jobs $(JOBS) \
	  --one-per-path
	rm -rf build/aot-$(CHECKED_TRITON)

# venv [packages]: make the environment unless it exists and passes its check.  Nothing
# byte-compiled at install (torch's thousands of modules): Python does it on first import.
define make_env
	@if [ "$(1)" = "$(2)/bin/python" ] && ! $(2)/bin/python -c "$(3)" 2>/dev/null; then \
	  echo 'making $(2) with $(4)'; \
	  { [ -x $(2)/bin/python ] || $(PYTHON) -m venv $(2); } && \
	  $(2)/bin/pip install -q --no-compile $(4); \
	fi
endef

build-env: aot-env ext-env

aot-env:
	$(call make_env,$(AOT_PY),$(AOT_VENV),$(AOT_CHECK),"triton==$(TRITON_VERSION)" click pytest wheel auditwheel $(LINT_PACKAGES))

ext-env:
	$(call make_env,$(BUILD_PY),$(BUILD_VENV),$(BUILD_CHECK),"$(TORCH_SPEC)" pybind11 "setuptools>=64" wheel click pytest)

# ruff.toml and .clang-format say what is checked.
lint: aot-env
	@if [ -x $(LINT_BIN)ruff ] && [ -x $(LINT_BIN)clang-format ]; then \
	  $(LINT_BIN)ruff check . && $(LINT_BIN)clang-format --dry-run --Werror $(CXX_SOURCES) && \
	  echo "style: ruff and clang-format pass"; \
	else echo "style NOT checked: $(AOT_PY)'s environment has no ruff / clang-format"; fi

# The style checks and the build-time tests run in the kernel compiler's environment.
# Where make build reused kernels compiled elsewhere and no Triton $(TRITON_VERSION) is
# here (a GPU machine without network), they ran where the kernels were compiled.
AOT_READY = $(AOT_PY) -c "$(AOT_CHECK)" 2>/dev/null

test: ext-env test-env bench-site
	@if $(AOT_READY); then $(MAKE) lint && $(AOT_PY) -m pytest -q tests/aot; \
	else echo "style checks and build-time tests NOT run: no Triton $(TRITON_VERSION) here"; fi
	$(call install_wheel,$(TEST_VENV))
	$(call runtime_tests,$(TEST_VENV))
	$(BENCH_PY) -m pytest -q $(CURDIR)/tests/bench
	@if $(TEST_PY) -c "$(HAS_GPU)"; then \
	  echo "GPU tests again, on the sm80 PTX compiled by the driver (GG_RUNTIME_FORCE_PTX=1):"; \
	  cd tests/runtime && GG_RUNTIME_FORCE_PTX=1 ../../$(TEST_PY) -m pytest -q test_gpu_*.py && \
	  echo "GPU tests again, each launch limited to 3 SMs' programs (GG_TEST_SM_LIMIT=3):" && \
	  GG_TEST_SM_LIMIT=3 ../../$(TEST_PY) -m pytest -q test_gpu_*.py; \
	else echo "no GPU here: the sm80 PTX and SM-limited passes of the GPU tests are skipped"; fi

MEMCHECK_ARGS ?=
memcheck: ext-env test-env bench-site
	$(call install_wheel,$(TEST_VENV))
	$(TEST_PY) tests/memcheck.py --logs build/memcheck --bench-site $(BENCH_SITE) $(MEMCHECK_ARGS)

# The test environment links the build environment's packages (its torch) rather than
# installing a second copy of torch.
test-env: ext-env
	$(BUILD_PY) tests/make_test_env.py $(TEST_VENV) "$(TORCH_SPEC)"

TORCH_VENV = .venv-$(subst ==,-,$(TORCH_SPEC))
test-torch:
	$(WHEEL_CHECK)
	$(PYTHON) tests/make_test_env.py $(TORCH_VENV) "$(TORCH_SPEC)" --index
	$(call install_wheel,$(TORCH_VENV))
	$(call runtime_tests,$(TORCH_VENV))

# Each environment holds a whole torch with its CUDA libraries: removed once tested, so
# that a small disk (CI's) holds one at a time.
test-torch-range:
	$(MAKE) test-torch TORCH_SPEC=$(OLDEST_TORCH)
	rm -rf .venv-$(subst ==,-,$(OLDEST_TORCH))
	$(MAKE) test-torch TORCH_SPEC=$(NEWEST_TORCH)
	rm -rf .venv-$(subst ==,-,$(NEWEST_TORCH))

# The wheel installed apart, for the build environment's Python to run bench/ against:
# first on the path, then the repository (bench/), run from build/ so that the current
# directory (the repository's gg_runtime/ is the source, without the extensions) does
# not come before it.
BENCH_SITE := build/bench-site
BENCH_PY = cd build && PYTHONPATH=$(CURDIR)/$(BENCH_SITE):$(CURDIR) \
	$(if $(findstring /,$(BUILD_PY)),$(CURDIR)/$(BUILD_PY),$(BUILD_PY))
BENCH_ARGS ?=

bench-site: ext-env
	$(WHEEL_CHECK)
	rm -rf $(BENCH_SITE)
	$(PYTHON) -m pip install -q --no-deps --no-index --target $(BENCH_SITE) dist/gg_runtime-*.whl

bench: bench-site
	$(BENCH_PY) -m bench.run $(BENCH_ARGS)

# The documentation's environment is remade when docs/requirements.txt (exact pins) changes.
# NO_MKDOCS_2_WARNING: mkdocs-material prints a notice about MkDocs 2 and its own end of life
# on every build; the pinned versions build as they are.
DOCS_VENV := .venv-docs
docs: $(DOCS_VENV)/installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict
	@echo "documentation: build/docs/index.html"

$(DOCS_VENV)/installed: docs/requirements.txt
	rm -rf $(DOCS_VENV)
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q -r docs/requirements.txt
	touch $@

clean:
	rm -rf build dist *.egg-info $(AOT_VENV) $(BUILD_VENV) $(TEST_VENV) $(DOCS_VENV) .venv-torch-* \
	  $(CHECK_VENV)
