#!/usr/bin/env bash
# Fuzzing (docs/reliability/fuzz.md): configures build-fuzz with clang and UBEP_FUZZ=ON (libFuzzer + ASan +
# UBSan; no unit tests, benchmarks or tools), builds that tree (the library and the fuzz targets), and runs
# `ctest -L fuzz`: each target for SECONDS (default 10) on a copy of its seed corpus (tests/fuzz/corpus/<target>/).
#   scripts/fuzz.sh [SECONDS]
# Environment: UBEP_FUZZ_BUILD_DIR (default build-fuzz). A crash leaves its input in
# <build>/tests/fuzz/work/<target>/artifacts/; rerun it with <build>/tests/fuzz/<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
seconds=${1:-10}
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS per target]" >&2
  exit 2
fi
build=${UBEP_FUZZ_BUILD_DIR:-build-fuzz}
command -v clang++ >/dev/null || bash scripts/deps.sh
echo "== fuzz build ($build, clang, UBEP_FUZZ=ON)"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_FUZZ=ON \
  -DUBEP_FUZZ_TIME="$seconds" -DUBEP_BUILD_TESTS=OFF -DUBEP_BUILD_BENCH=OFF -DUBEP_BUILD_TOOLS=OFF \
  -DUBEP_INSTALL=OFF >/dev/null
# The tree holds the library and the fuzz targets only (tests, benchmarks and tools are off): build it all.
# (Picking targets from `ninja -t targets | grep -q` raced: grep quits at its first match, ninja dies of
# SIGPIPE, and under pipefail the hwloc target was sometimes left out.)
cmake --build "$build" -j "$JOBS"
echo "== fuzz tests ($build, ${seconds} s per target)"
# The suppressions of the MPI tests: Open MPI, UCX and hwloc keep process-lifetime allocations.
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
ctest --test-dir "$build" --output-on-failure -L fuzz -j "$JOBS"
