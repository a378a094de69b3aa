#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole test suite:
#   1. format check (clang-format, the project's .clang-format)
#   2. the default build (Open MPI, with the docs target): docs (README's and docs/'s relative links, the
#      Doxygen API reference without a warning), unit, mpi (2/3/4 ranks, default and forced-mpi routes),
#      install/consumer, bench-smoke, multinode (emulated nodes; needs root and ip netns), the resource
#      limits (limits_test, the 4 GiB transfer), the fault jobs (label faults) and a 60 s soak (label soak)
#   3. an MPICH build in its own tree (build-mpich): unit, install.consumer, and the mpi tests at 2 ranks
#      (default and forced-mpi routes); MPICH busy-polls, so it never gets more ranks than this machine's
#      2 cores (no np3/np4 tests, one MPI job at a time; not the 4 GiB transfer)
#   4. an AddressSanitizer + UndefinedBehaviorSanitizer build in its own tree: unit + mpi tests
#   5. the libFuzzer targets (scripts/fuzz.sh: clang, build-fuzz), 10 s each
#   6. a ThreadSanitizer build in its own tree (build-tsan): the tests that run a second thread (progress
#      thread on the ucx and mpi routes and driving the staged GPU route, the ucx route's default thread under
#      faults and forged messages, bounded MPI calls, a soak run with the progress thread, the MoE relay thread)
#   7. a SimGrid build in its own tree (build-sim, UBEP_SIMGRID=ON): the RMA, signal and MoE suites at 8 and
#      32 simulated ranks and at 16 on 2 hosts of 8, ubep_moe_bench at 64, bench/sim/run.sh --quick under
#      smpirun, and bench/sim/calibrate.sh --quick (emulated nodes with the default tree's benchmarks against
#      their simulation) (label sim)
# Environment: UBEP_TEST_SKIP_MPICH=1 skips step 3, UBEP_TEST_SKIP_ASAN=1 step 4, UBEP_TEST_SKIP_FUZZ=1 step 5,
# UBEP_TEST_SKIP_TSAN=1 step 6, UBEP_TEST_SKIP_SIM=1 step 7; UBEP_BUILD_DIR (default build) names the default tree.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
if [[ "${UBEP_TEST_SKIP_MPICH:-0}" != 1 ]]; then export UBEP_WITH_MPICH=1; fi
if [[ "${UBEP_TEST_SKIP_SIM:-0}" != 1 ]]; then export UBEP_WITH_SIMGRID=1; fi
bash scripts/deps.sh

echo "== format check"
bash scripts/format.sh --check

build=${UBEP_BUILD_DIR:-build}
echo "== build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_WERROR=ON -DUBEP_BUILD_DOCS=ON >/dev/null
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
  # ranks at once than there are cores. The multinode suites registered in this tree are not run here, nor
  # the static-archive and subproject builds of libubep (install.consumer.static, install.subproject: a
  # library build each, about 50 s, testing packaging that does not depend on the MPI; the default tree runs
  # them, and install.consumer runs here: find_package(ubep) and pkg-config against MPICH).
  ctest --test-dir build-mpich --output-on-failure -j "$JOBS" -L "unit|mpi" -LE multinode \
    -E '\.np([013-9]|[1-9][0-9]+)(\.|$)|\.big(\.|$)|^install\.(consumer\.static|subproject)$' --timeout 600
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
  # itself dies). Those tests still run under ASan and UBSan, without the exit-time leak scan. So does
  # route_faults_test on the default route: most of its tests force the ucx route, and peers that are
  # gone at finalize keep UCX's async thread busy (its tracer died so in 1 of 2 CI runs on 2026-12-07).
  # The sanitized legs run every suite at 2 and 4 ranks on the default route, and at 2 ranks on the
  # mpi and ucx routes and virtual nodes (plus MoE at 4 ranks on 2 virtual nodes: the only layout with
  # more than one rank per node on both sides); the 3-rank runs, 4 ranks on the other routes, 3 and
  # uneven emulated nodes, rdma between emulated nodes and the accumulate-signal variant run in the
  # default build only (the same code paths as the runs kept here; the ucx_thread runs are in the TSan leg).
  skip='\.np3(\.|$)|vnodes3|vnodes_uneven|vnodes_rdma|\.acc\.'
  routes='(mpi|vnodes|vnodes3|vnodes_uneven|ucx|vnodes_mpi|vnodes3_mpi|vnodes_rdma|ucx_rdma|ucx_thread)$'
  no_leak_scan="\\.$routes|^route_faults_test\\.np[0-9]+$"
  ASAN_OPTIONS=detect_leaks=1:$asan \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L "unit|mpi" -LE "multinode|install" \
    -E "$no_leak_scan|$skip" --timeout 900
  ASAN_OPTIONS=detect_leaks=0:$asan \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L mpi -LE multinode \
    -R "\\.np2\\.(.*\\.)?$routes|^moe_test\\.np4\\.vnodes$|^route_faults_test\\.np[0-9]+$" -E "$skip" \
    --timeout 900
fi
if [[ "${UBEP_TEST_SKIP_FUZZ:-0}" != 1 ]]; then
  # libFuzzer (clang, its own tree build-fuzz): every fuzz target for 10 s on its seed corpus.
  bash scripts/fuzz.sh 10
fi

if [[ "${UBEP_TEST_SKIP_TSAN:-0}" != 1 ]]; then
  echo "== ThreadSanitizer build (build-tsan): the progress thread (and the staged GPU route it drives), UCX's worker lock, the bounded MPI calls, the MoE relay thread"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_TSAN=ON -DUBEP_BUILD_BENCH=OFF >/dev/null
  cmake --build build-tsan -j "$JOBS" --target rma_test signal_test runtime_regression_test stall_test ubep-stress gpu_heap_test \
    route_faults_test moe_modes_test
  echo "== tests (build-tsan)"
  # Open MPI's memory patcher and UCX's memory hooks intercept munmap/madvise, also in a thread that TSan
  # has already torn down (a segfault at thread exit): both off. tsan.supp says what else is not ours.
  OMPI_MCA_memory=^patcher UCX_MEM_EVENTS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$JOBS" --timeout 600 \
    -R '\.ucx_thread$|^stall_test\.|^rma_test\.np2\.thread\.mpi$|^soak\..*thread|^gpu_heap_test\.np2\.vnodes_thread$|^route_faults_test\.np3\.ucx$|^moe_modes_test\.np4\.vnodes_relay_thread$'
fi
if [[ "${UBEP_TEST_SKIP_SIM:-0}" != 1 ]]; then
  echo "== SimGrid build (build-sim): every rank a simulated host, signals as messages, blocking waits"
  cmake -S . -B build-sim -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_SIMGRID=ON -DUBEP_WERROR=ON \
    -DUBEP_SIM_HOST_BUILD="$PWD/$build" >/dev/null
  cmake --build build-sim -j "$JOBS"
  echo "== tests (build-sim)"
  ctest --test-dir build-sim --output-on-failure -j "$JOBS" -L sim --timeout 600
fi
echo "== all tests passed"
