# Entry points for people and CI. The real build is CMake (CMakeLists.txt); this file only
# checks system packages and runs the usual configure/build/test sequences.
#
#   make demo    build and run examples/quickstart
#   make test    build everything and run all tests (exit status is the test result)
#   make train   install Fashion-MNIST, build examples/train_fashion_mnist (-O3) and train T1
#   make bench   build the benchmarks in build-bench/ and run bench/run_all (ISA=avx2: at AVX2)
#   make deps    check (and, as root, install) the Debian packages the build needs
#   make clean   remove the build directories

BUILD_DIR  ?= build
# The vector ISA of `make bench` (issue 24): native, avx2 (-march=x86-64-v3: AVX2 + FMA; OpenBLAS,
# libtorch and the JIT pinned to it too) or avx512 (x86-64-v4). Each has its own build directory.
ISA        ?= native
BENCH_DIR  ?= $(if $(filter native,$(ISA)),build-bench,build-bench-$(ISA))
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE      ?= cmake
CTEST      ?= ctest
# Extra arguments for every configure, e.g. CMAKE_ARGS=-DCMAKE_PREFIX_PATH=$$PWD/.deps/usr
CMAKE_ARGS ?=

# Sub-makes started by `cmake --build` would otherwise print "Entering directory" lines.
MAKEFLAGS  += --no-print-directory

DEPS       := libboost-dev libxsimd-dev catch2 zlib1g-dev cmake g++ make
BENCH_DEPS := $(DEPS) libeigen3-dev libtorch-dev libopenblas-dev libxnnpack-dev libpthreadpool-dev
# Fashion-MNIST (31 MB, in /usr/share/datasets/fashion-mnist/, where fusebox::data looks first):
# `make train` needs it, and with it `make test` runs the training example's smoke test
# (examples.train_fashion_mnist_smoke) instead of skipping it.
DATA_DEPS  := dataset-fashion-mnist
# The edge configuration's aarch64 tests (CTest label aarch64): Debian's cross compiler and qemu.
CROSS_DEPS := g++-aarch64-linux-gnu qemu-user
# Arguments for `make train`: T1 by default (the MLP, 10 epochs, the GPU when there is one).
# E.g. TRAIN_ARGS="--model cnn --lr 3e-3 --schedule cosine" (T2), or "--device cpu".
TRAIN_ARGS ?=

.PHONY: all demo test train bench deps test-deps bench-deps clean
all: test

# $(call check_deps,<packages>): install what is missing as root; otherwise print the one
# command that fixes it and fail. Without dpkg (not Debian) the check is skipped and CMake
# reports whatever is missing.
define check_deps
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "deps: dpkg not found; not a Debian system, skipping the package check" >&2; exit 0; \
	fi; \
	missing=""; \
	for p in $(1); do \
	  dpkg -s "$$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing="$$missing $$p"; \
	done; \
	missing="$${missing# }"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "deps: installing $$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	  else \
	    echo "sudo apt-get install -y $$missing"; \
	    exit 1; \
	  fi; \
	fi
endef

deps:
	$(call check_deps,$(DEPS))

test-deps:
	$(call check_deps,$(DEPS) $(DATA_DEPS) $(CROSS_DEPS))

bench-deps:
	$(call check_deps,$(BENCH_DEPS))

demo: deps
	$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DFUSEBOX_BUILD_EXAMPLES=ON $(CMAKE_ARGS)
	$(CMAKE) --build $(BUILD_DIR) --target quickstart -j $(JOBS)
	./$(BUILD_DIR)/examples/quickstart

# ctest's own summary ("N% tests passed, M tests failed out of K" and the list of failures) is
# the report; the last line says in one word whether to look further up. Some tests run builds
# themselves (header check, compile-fail): CMAKE_BUILD_PARALLEL_LEVEL gives them JOBS too.
test: test-deps
	@$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DFUSEBOX_BUILD_TESTS=ON -DFUSEBOX_BUILD_EXAMPLES=OFF $(CMAKE_ARGS) \
	  || { echo "==> make test: FAILED (configure)"; exit 1; }
	@$(CMAKE) --build $(BUILD_DIR) -j $(JOBS) \
	  || { echo "==> make test: FAILED (build; see the first error above)"; exit 1; }
	@cd $(BUILD_DIR) && CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(CTEST) --output-on-failure -j $(JOBS) \
	  || { echo "==> make test: FAILED (see the failed tests listed above)"; exit 1; }
	@echo "==> make test: PASSED"

train: test-deps
	$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DFUSEBOX_BUILD_EXAMPLES=ON $(CMAKE_ARGS)
	$(CMAKE) --build $(BUILD_DIR) --target train_fashion_mnist -j $(JOBS)
	./$(BUILD_DIR)/examples/train_fashion_mnist $(TRAIN_ARGS)

ISA_MARCH_native := native
ISA_MARCH_avx2   := x86-64-v3
ISA_MARCH_avx512 := x86-64-v4

bench: bench-deps
	@if [ ! -f bench/CMakeLists.txt ]; then \
	  echo "bench: bench/CMakeLists.txt does not exist yet; nothing to build"; exit 0; \
	fi; \
	if [ -z "$(ISA_MARCH_$(ISA))" ]; then \
	  echo "bench: ISA=$(ISA) is not one of native, avx2, avx512" >&2; exit 2; \
	fi; \
	set -e; \
	$(CMAKE) -S . -B $(BENCH_DIR) -DCMAKE_BUILD_TYPE=Release -DFUSEBOX_BUILD_BENCH=ON \
	  -DFUSEBOX_ARCH=$(ISA_MARCH_$(ISA)) -DFUSEBOX_BUILD_TESTS=OFF -DFUSEBOX_BUILD_EXAMPLES=OFF $(CMAKE_ARGS); \
	$(CMAKE) --build $(BENCH_DIR) -j $(JOBS); \
	if [ -x $(BENCH_DIR)/bench/run_all ]; then \
	  ./$(BENCH_DIR)/bench/run_all; \
	else \
	  echo "bench: built, but bench/CMakeLists.txt defines no run_all program yet"; \
	fi

clean:
	rm -rf $(BUILD_DIR) build-bench build-bench-avx2 build-bench-avx512 $(BENCH_DIR)
