#!/usr/bin/env bash
# `make test-gpu` and `leanloader bench gpu` on a lent GPU machine that has a
# compiler, CMake, nanobind, scikit-build-core and a CUDA build of torch but no
# network and none of our Debian libraries (the device tool's machines).
#
#   tests/gpu/on_lent_machine.sh DEBS_DIR OUT_DIR [bench arguments ...]
#
# DEBS_DIR holds Debian bookworm .deb files of the libraries the build needs
# (`tests/gpu/fetch_debs.sh DEBS_DIR`, run where apt works): they are unpacked
# into a private root, found through pkg-config's sysroot, and at run time only
# the libraries the machine lacks are put on LD_LIBRARY_PATH. Each step writes
# its log to OUT_DIR; a failing step does not stop the later ones.
set -uo pipefail
debs=$(realpath "$1")
out=$(realpath -m "$2")
shift 2
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--rounds 3)
python=${PYTHON:-python3}
root=/tmp/leanloader-sysroot
site=/tmp/leanloader-site
mkdir -p "$root" "$out" "$site"
lib=$root/usr/lib/x86_64-linux-gnu

step() { echo "== $1 ($(date +%T))"; }

step "machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$python" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
  c++ --version | head -1
  nproc
} 2>&1 | tee "$out/machine.txt"

step "unpack"
for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done

# pkg-config: the machine's when it has one, else bookworm's pkgconf.
if ! command -v pkg-config >/dev/null; then
  mkdir -p "$root/bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$lib" "$root/usr/bin/pkgconf" >"$root/bin/pkg-config"
  chmod +x "$root/bin/pkg-config"
  export PATH=$root/bin:$PATH
fi
export PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$lib/pkgconfig:$root/usr/share/pkgconfig
export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)

step "libraries the machine lacks"
# Every carried library whose soname the machine lacks (the build imports the
# extension to write its stubs, so this comes first).
missing=$root/missing
mkdir -p "$missing"
"$python" - "$root" "$missing" <<'EOF' 2>&1 | tee "$out/libraries.txt"
import glob, os, subprocess, sys
root, missing = sys.argv[1:]
have = {line.split()[0] for line in subprocess.run(["ldconfig", "-p"], capture_output=True,
                                                   text=True).stdout.splitlines()[1:] if line.strip()}
for libdir in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"):
    for path in glob.glob(f"{root}/{libdir}/**/*.so.*", recursive=True):
        name = os.path.basename(path)
        if name in have or os.path.exists(os.path.join(missing, name)):
            continue
        os.symlink(os.path.realpath(path), os.path.join(missing, name))
        print("from bookworm:", name)
EOF
export LD_LIBRARY_PATH=$missing${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

step "build"
built=$(ls "$debs"/_core*.so 2>/dev/null | head -1)
if [ -n "$built" ]; then
  # An extension built by an earlier run of this script (returned in OUT_DIR)
  # beside this tree's Python files: for changes that touch no C++.
  cp -r python/leanloader "$site/" && cp "$built" "$site/leanloader/"
  echo "using $built"
else
  link_dirs="-Wl,-rpath-link,$lib -Wl,-rpath-link,$lib/blas -Wl,-rpath-link,$lib/lapack"
  # Warnings stay warnings here (a GCC we do not test with); they are in the log.
  "$python" -m pip install -v --upgrade --no-build-isolation --no-deps --no-compile --target "$site" \
    -C build-dir=/tmp/leanloader-build -C cmake.define.CMAKE_PREFIX_PATH="$root/usr" \
    -C cmake.define.CMAKE_MODULE_LINKER_FLAGS="$link_dirs" \
    -C cmake.define.PKG_CONFIG_EXECUTABLE="$(command -v pkg-config)" \
    -C cmake.define.LEANLOADER_WARNINGS_AS_ERRORS=OFF . >"$out/build.log" 2>&1
  echo "build exit $?"
  grep -c "warning:" "$out/build.log" | sed 's/^/compiler warnings: /'
  cp "$site"/leanloader/_core*.so "$out/"
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
# For commands run after this script: `. /tmp/leanloader-sysroot/env.sh`.
printf 'export PYTHONPATH=%q LD_LIBRARY_PATH=%q\n' "$PYTHONPATH" "$LD_LIBRARY_PATH" >"$root/env.sh"

"$python" -c 'import leanloader as ll, leanloader._core; print("leanloader", ll.__file__)' 2>&1 | tee -a "$out/libraries.txt"

step "make test-gpu: C++ device tests are CPU stand-in tests (make test runs them); the GPU tests"
if [ "${GPU_TESTS:-1}" = 1 ]; then
  timeout 240 "$python" -m pytest -p no:cacheprovider -q -rs -s --timeout 120 tests/gpu 2>&1 | tee "$out/test_gpu.log" | tail -40
fi

step "leanloader bench gpu ${bench_args[*]}"
timeout "${BENCH_TIMEOUT:-270}" "$python" -c 'import sys; from leanloader.cli import main; sys.exit(main())' \
  bench gpu --data-dir /tmp/leanloader-bench "${bench_args[@]}" 2>&1 | tee "$out/bench_gpu.txt" | tail -60

step "done"
