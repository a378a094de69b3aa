#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole test suite:
#   1. format check (clang-format, the project's .clang-format)
#   2. the default build (Open MPI): unit, mpi (2/3/4 ranks, default and forced-mpi routes),
#      install/consumer, bench-smoke, and multinode (emulated nodes; needs root and ip netns)
#   3. an MPICH build in its own tree (build-mpich): unit, install/consumer, and the mpi tests at 2 ranks
#      (default and forced-mpi routes); MPICH busy-polls, so it never gets more ranks than this machine's
#      2 cores (no np3/np4 tests, one MPI job at a time)
#   4. an AddressSanitizer + UndefinedBehaviorSanitizer build in its own tree: unit + mpi tests
# Environment: UBEP_TEST_SKIP_MPICH=1 skips step 3, UBEP_TEST_SKIP_ASAN=1 step 4; UBEP_BUILD_DIR (default
# build) names the default tree.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
if [[ "${UBEP_TEST_SKIP_MPICH:-0}" != 1 ]]; then export UBEP_WITH_MPICH=1; fi
bash scripts/deps.sh

echo "== format check"
bash scripts/format.sh --check

build=${UBEP_BUILD_DIR:-build}
echo "== build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_WERROR=ON >/dev/null
cmake --build "$build" -j "$JOBS"
echo "== tests ($build)"
ctest --test-dir "$build" --output-on-failure -j "$JOBS" --timeout 600

if [[ "${UBEP_TEST_SKIP_MPICH:-0}" != 1 ]]; then
  echo "== MPICH build (build-mpich)"
  # One MPI per build directory: FindMPI caches what it found.
  cmake -S . -B build-mpich -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_WERROR=ON -DUBEP_BUILD_BENCH=OFF \
    -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich >/dev/null
  cmake --build build-mpich -j "$JOBS"
  echo "== tests (build-mpich): unit, install, mpi at 2 ranks"
  # Every test that starts ranks declares PROCESSORS = its rank count, so -j "$JOBS" never runs more MPICH
  # ranks at once than there are cores. The multinode suites registered in this tree are not run here.
  ctest --test-dir build-mpich --output-on-failure -j "$JOBS" -L "unit|mpi" -LE multinode \
    -E '\.np([013-9]|[1-9][0-9]+)(\.|$)' --timeout 600
fi

if [[ "${UBEP_TEST_SKIP_ASAN:-0}" != 1 ]]; then
  echo "== sanitizer build (build-asan)"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DUBEP_SANITIZE=ON -DUBEP_BUILD_BENCH=OFF >/dev/null
  cmake --build build-asan -j "$JOBS"
  echo "== tests (build-asan)"
  export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  asan=abort_on_error=1:fast_unwind_on_malloc=0
  # Leak checking everywhere except where ranks talk through MPI RMA or UCX (forced mpi and ucx
  # routes, emulated nodes): there UCX runs its async thread, and
  # LeakSanitizer's own tracer then segfaults at exit in about 1 run in 4 (no leak is reported; LSan
  # itself dies). Those tests still run under ASan and UBSan, without the exit-time leak scan.
  ASAN_OPTIONS=detect_leaks=1:$asan \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L "unit|mpi" -LE "multinode|install" -E '\.(mpi|vnodes|vnodes3|vnodes_uneven|ucx|vnodes_mpi|vnodes3_mpi|vnodes_rdma|ucx_rdma|ucx_thread)$' --timeout 900
  ASAN_OPTIONS=detect_leaks=0:$asan \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L mpi -LE multinode -R '\.(mpi|vnodes|vnodes3|vnodes_uneven|ucx|vnodes_mpi|vnodes3_mpi|vnodes_rdma|ucx_rdma|ucx_thread)$' --timeout 900
fi
echo "== all tests passed"
