#!/usr/bin/env bash
# Every GPU check of ubep in one go, on a machine with an NVIDIA GPU (issue 15). It needs CUDA (nvcc), CMake,
# a C++ compiler and Python; MPI, GoogleTest, CLI11 and nlohmann-json may be missing: then it unpacks
# Debian's packages of them (made here with --fetch-debs) into a prefix, and runs Open MPI from there with
# OPAL_PREFIX. No network is needed on the GPU machine.
#
#   tests/gpu/check.sh LOGDIR             build (build-gpu), run the checks, write LOGDIR/<step>.log and
#                                         LOGDIR/summary.txt; exit 0 when every step passed
#   tests/gpu/check.sh --quick LOGDIR     only the GPU targets and the GPU tests (no memcheck, benchmarks or
#                                         unit label): what fits a short device window
#   tests/gpu/check.sh --fetch-debs DIR   (on a Debian 12 machine with apt, e.g. the build machine) download the
#                                         packages into DIR (about 10 MB), to carry to the GPU machine
#
# Steps: the GPUs and their compute mode (first: in an exclusive mode two ranks cannot share a GPU, and every
# test of 2 ranks fails), environment (nvcc, compilers), MPI (installed, or unpacked from UBEP_GPU_DEBS),
# configure + build (Release with debug info, CUDA required; warnings are not errors here: the device image's
# compilers may be newer than the ones CI builds with), the PTX check and its self-test,
# label gpu under UBEP_REQUIRE_GPU=1 (gpu.device_check, gpu.kernels_check: a skip is a failure), the GPU
# context, public API, GPU heap and MoE-on-GPU-memory tests under mpirun, compute-sanitizer memcheck of
# gpu_kernels_check (when the tool is there and the machine lets it run; "not run" otherwise, not a failure),
# the --memory host|device benchmark runs (put and get latency, put bandwidth, signal latency on one GPU, put bandwidth
# across 2 virtual nodes: the staged route; ubep_moe_bench at 4 ranks), then the unit label as a smoke test of
# the build. Well under ten minutes on a 16-core machine (the build is most of it). Every wait of ubep times
# out after UBEP_WAIT_TIMEOUT=30 s (unless set), every ctest after 180 s (--timeout, where a test sets none),
# and every other launch under `timeout`, so a hang costs minutes, not the device window.
#
# Environment: UBEP_GPU_DEBS (default .gpu-debs in the source tree: the folder of .deb files), UBEP_GPU_BUILD
# (default build-gpu), UBEP_GPU_PREFIX (default /tmp/ubep-gpu-prefix: where the packages are unpacked),
# UBEP_GPU_USE_DEBS=1 (use the packages even where an MPI is installed: how the script is tested without a GPU
# machine), UBEP_REQUIRE_GPU (default 1; 0 lets the gpu label skip, for that test).
set -uo pipefail
cd "$(dirname "$0")/../.."
src=$PWD

# What the GPU machine lacks, for --fetch-debs: Open MPI and its libraries, GoogleTest, CLI11, nlohmann-json.
# Every library they load that an Ubuntu or Debian base system may lack (checked with readelf: what is left
# is libc, libm, libstdc++, libgcc_s, libz, libudev, libuuid).
debs=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15
  libpmix2 libucx0 libfabric1 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2
  libpsm-infinipath1 libnuma1 libmunge2 libltdl7 libpciaccess0 libgfortran5 libquadmath0 libatomic1 libgtest-dev
  libcli11-dev nlohmann-json3-dev)

if [[ "${1:-}" == --fetch-debs ]]; then
  dir=${2:?usage: tests/gpu/check.sh --fetch-debs DIR}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  (cd /tmp && apt-get update -qq && cd "$dir" && apt-get download "${debs[@]}") || exit 1
  echo "$(ls "$dir"/*.deb | wc -l) packages in $dir ($(du -sh "$dir" | cut -f1))"
  exit 0
fi
quick=0
if [[ "${1:-}" == --quick ]]; then
  quick=1
  shift
fi
if [[ $# -ne 1 || "$1" == -* ]]; then
  sed -n '7,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1"
logs=$(cd "$1" && pwd)
summary=$logs/summary.txt
: >"$summary"
failed=0
build=${UBEP_GPU_BUILD:-build-gpu}
export UBEP_REQUIRE_GPU=${UBEP_REQUIRE_GPU:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 GTEST_COLOR=no
export OMPI_MCA_osc=${OMPI_MCA_osc:-ucx,sm}
export UBEP_WAIT_TIMEOUT=${UBEP_WAIT_TIMEOUT:-30}
jobs=$(nproc)
ctest_limit=(--timeout 180)

# step NAME COMMAND...: runs COMMAND with its output in LOGDIR/NAME.log, one line in the summary.
# Exit status 77 of the command is "not run" (with the log's last line as the reason), not a failure.
step() {
  local name=$1
  shift
  local t0=$SECONDS rc
  echo "== $name"
  "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local line
  if ((rc == 0)); then
    line="ok       $name ($((SECONDS - t0)) s)"
  elif ((rc == 77)); then
    line="not run  $name: $(tail -n 1 "$logs/$name.log")"
  else
    line="FAILED   $name (exit $rc, $((SECONDS - t0)) s): see $name.log"
    failed=1
    tail -n 30 "$logs/$name.log"
  fi
  echo "$line" | tee -a "$summary"
  return $rc
}

# The GPUs and their compute mode, printed first (also to the terminal).
gpu_mode() {
  if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi is not installed: no NVIDIA driver here"
    return 0
  fi
  timeout 60 nvidia-smi --query-gpu=index,name,compute_mode,driver_version,memory.total --format=csv || return 1
  if timeout 60 nvidia-smi --query-gpu=compute_mode --format=csv,noheader | grep -qi exclusive; then
    echo "WARNING: a GPU is in an exclusive compute mode: two ranks cannot share it, so every test of 2 or more"
    echo "ranks on it fails (as root: nvidia-smi -c DEFAULT)"
  fi
}

environment() {
  uname -a
  nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$nvcc_bin" --version
  cmake --version | head -n 1
  c++ --version | head -n 1
  python3 --version
}

# MPI, GoogleTest, CLI11, nlohmann-json: installed, or unpacked from the packages into the prefix.
mpi_cxx=$(command -v mpicxx || true)
mpi_exec=$(command -v mpiexec || true)
prepare_mpi() {
  if [[ -n "$mpi_cxx" && -n "$mpi_exec" && "${UBEP_GPU_USE_DEBS:-0}" != 1 ]]; then
    echo "MPI installed: $mpi_cxx, $mpi_exec"
    "$mpi_exec" --version | head -n 1
    return 0
  fi
  local dir=${UBEP_GPU_DEBS:-$src/.gpu-debs}
  local n
  n=$(ls "$dir"/*.deb 2>/dev/null | wc -l)
  if ((n == 0)); then
    echo "no MPI here and no packages in $dir: run tests/gpu/check.sh --fetch-debs $dir on a Debian 12 machine"
    return 1
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$prefix" || return 1; done
  # The link Debian's alternatives make at install time (libfabric and Open MPI's psm component need it).
  local psm=$prefix/usr/lib/libpsm1/libpsm_infinipath.so.1.16
  [[ -f "$psm" ]] && ln -sf "$psm" "$prefix/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
  echo "unpacked $n packages from $dir into $prefix"
  "$prefix/usr/bin/mpiexec.openmpi" --version | head -n 1
}
prefix=${UBEP_GPU_PREFIX:-/tmp/ubep-gpu-prefix}
step gpu_mode gpu_mode
cat "$logs/gpu_mode.log"
step environment environment
step mpi prepare_mpi || {
  echo "cannot go on without MPI" | tee -a "$summary"
  exit 1
}
cmake_mpi=()
mpiexec_bin=$mpi_exec
if [[ -x "$prefix/usr/bin/mpiexec.openmpi" && ("${UBEP_GPU_USE_DEBS:-0}" == 1 || -z "$mpi_cxx" || -z "$mpi_exec") ]]; then
  lib=$prefix/usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$prefix/usr
  export PATH=$prefix/usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$lib/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Debian's Open MPI uses the external PMIx of libpmix2: its install prefix and plugins moved with it.
  export PMIX_INSTALL_PREFIX=$lib/pmix2 PMIX_MCA_mca_base_component_path=$lib/pmix2/lib/pmix
  # Debian's MCA defaults (pml ob1, no osc pt2pt) live in /etc/openmpi, which OPAL_PREFIX does not move.
  export OMPI_MCA_mca_base_param_files=$prefix/etc/openmpi/openmpi-mca-params.conf
  cmake_mpi=(-DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.openmpi" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpiexec.openmpi"
    -DCMAKE_PREFIX_PATH="$prefix/usr")
  mpiexec_bin=$prefix/usr/bin/mpiexec.openmpi
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
configure() {
  local nvcc_bin
  nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  local targets=()
  # --quick: the GPU checks, the PTX and the MPI tests the mpi_gpu step runs (with the library they link).
  ((quick)) && targets=(--target gpu_device_check gpu_kernels_check ubep_transports_cuda_ptx gpu_context_test
    public_api_test stream_test gpu_heap_test moe_device_test)
  cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_WERROR=OFF \
    -DUBEP_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DUBEP_BUILD_BENCH=$((quick ? 0 : 1)) \
    -DUBEP_BUILD_MICRO=OFF "${cmake_mpi[@]}" &&
    cmake --build "$build" -j "$jobs" "${targets[@]}"
}
step build configure || {
  echo "cannot go on without a build" | tee -a "$summary"
  exit 1
}
step ptx ctest --test-dir "$build" --output-on-failure "${ctest_limit[@]}" --no-tests=error \
  -R '^build\.ptx_(signal_orderings|check_self_test)$'
step gpu ctest --test-dir "$build" --output-on-failure "${ctest_limit[@]}" -L gpu --no-tests=error
step mpi_gpu ctest --test-dir "$build" --output-on-failure "${ctest_limit[@]}" --no-tests=error \
  -R '^((gpu_context_test|public_api_test|stream_test|gpu_heap_test|moe_device_test)\.np2|(gpu_heap|moe_device)_test\.np[24]\.vnodes)$'
if ((quick)); then
  echo "not run  memcheck, bench_device, unit: --quick" | tee -a "$summary"
  echo "== summary ($summary)"
  cat "$summary"
  exit $failed
fi
memcheck() {
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [[ -z "$cs" ]]; then
    echo "compute-sanitizer is not installed"
    return 77
  fi
  timeout 600 "$cs" --tool memcheck --error-exitcode 3 "$build/tests/gpu_kernels_check"
  local rc=$?
  # The tool refuses some virtualized devices ("Device not supported"): that is no finding about ubep.
  if ((rc != 0 && rc != 3)) && grep -q "Device not supported" "$logs/memcheck.log"; then
    echo "compute-sanitizer does not support this device"
    return 77
  fi
  return $rc
}
step memcheck memcheck
# GPU numbers: ubep's put, get, put bandwidth and put_signal between 2 processes on the GPU (CUDA IPC), and put
# bandwidth across 2 virtual nodes (the staged route), beside the host-memory runs of the same job sizes. The logs keep the tables.
bench_device() (  # a subshell: its exports end with it
  local run=(timeout 300 "$mpiexec_bin" -n 2 --oversubscribe)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  local b=$build/bench common=(--max-size 4194304 -i 2000 --iterations-large 200 -x 100 --batches 5)
  local rc=0 mem moe_tokens=128,1024
  if [[ "${UBEP_REQUIRE_GPU:-1}" == 0 ]] && ! nvidia-smi >/dev/null 2>&1; then
    export UBEP_GPU_EMULATE=1  # testing the script without a GPU: the heap emulated in host memory
    moe_tokens=128             # (host memory standing in for GPU memory: keep the MoE run small)
    echo "no GPU and UBEP_REQUIRE_GPU=0: --memory device on the EMULATED heap (UBEP_GPU_EMULATE=1)"
  fi
  for mem in host device; do
    echo "== ubep_put_latency --memory $mem"
    "${run[@]}" "$b/ubep_put_latency" "${common[@]}" --memory $mem || rc=1
    echo "== ubep_get_latency --memory $mem"
    "${run[@]}" "$b/ubep_get_latency" "${common[@]}" --memory $mem || rc=1
    echo "== ubep_put_bw --memory $mem"
    "${run[@]}" "$b/ubep_put_bw" --max-size 1048576 -i 100 --iterations-large 20 --memory $mem || rc=1
    echo "== ubep_signal_latency --memory $mem"
    "${run[@]}" "$b/ubep_signal_latency" --max-size 1048576 -i 2000 --iterations-large 200 --memory $mem || rc=1
    echo "== ubep_put_bw --memory $mem, 2 virtual nodes (device: the staged route)"
    UBEP_VIRTUAL_NODES=2 "${run[@]}" "$b/ubep_put_bw" --max-size 1048576 -i 20 --iterations-large 5 \
      --memory $mem || rc=1
  done
  # MoE dispatch/combine with GPU buffers (moe::Config::memory) beside host buffers, 4 ranks on the one GPU.
  for mem in host device; do
    echo "== ubep_moe_bench --memory $mem"
    timeout 600 "$mpiexec_bin" -n 4 --oversubscribe "$b/ubep_moe_bench" --tokens $moe_tokens --compute-us-per-token 0 --memory $mem || rc=1
  done
  return $rc
)
step bench_device bench_device
step unit ctest --test-dir "$build" --output-on-failure "${ctest_limit[@]}" -L unit -j "$jobs"

echo "== summary ($summary)"
cat "$summary"
exit $failed
