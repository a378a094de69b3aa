#!/usr/bin/env bash
# The main job: installs what is missing, builds (Release), and runs the main benchmark with 4 ranks on
# this machine. Arguments are passed to the benchmark. UBEP_NP sets the rank count.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/deps.sh
build=${UBEP_BUILD_DIR:-build-release}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUBEP_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$JOBS"
np=${UBEP_NP:-4}
if [[ -x "$build/bench/ubep_moe_bench" ]]; then
  exec mpirun -np "$np" "$build/bench/ubep_moe_bench" "$@"
fi
# Until the MoE benchmark exists: put and get latency, ubep beside plain MPI.
mpirun -np 2 "$build/bench/ubep_put_latency" "$@"
mpirun -np 2 "$build/bench/ubep_get_latency" "$@"
