#!/usr/bin/env bash
# The main job: installs what is missing, builds (Release), and runs the MoE dispatch/combine benchmark
# (ubep against the BSP baseline) with 4 ranks on this machine. Arguments go to the benchmark; UBEP_NP
# sets the rank count.
#   scripts/run.sh --multinode [args]   runs bench/multinode.sh instead: the latency per route and the MoE
#                                       benchmark per schedule across emulated nodes (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/deps.sh
build=${UBEP_BUILD_DIR:-build-release}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUBEP_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$JOBS"
if [[ ${1:-} == --multinode ]]; then
  shift
  exec bash bench/multinode.sh --build "$build" "$@"
fi
exec mpirun -np "${UBEP_NP:-4}" "$build/bench/ubep_moe_bench" "$@"
