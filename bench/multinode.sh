#!/usr/bin/env bash
# bench/multinode.sh: the inter-node benchmarks, on nodes emulated by tests/multinode/emulate.sh (network
# namespaces, TCP between them, optional tc rate limits), with one summary of the ratios at the end.
#
#   1. latency per route, ubep beside its MPI baselines in the same job (ubep_signal_latency and
#      ubep_put_latency, rank 0 <-> rank 1):
#        shm          2 ranks on this machine, the default route
#        mpi/1 node   2 ranks on this machine, UBEP_TRANSPORTS=mpi
#        node         2 emulated nodes under one switch
#        spine        2 emulated nodes under two switches (the path crosses the spine, shaped)
#      Between nodes each job times ubep over both off-node routes, mpi and ucx (builds with UCX), one
#      Context each, beside the same baselines (the benchmarks' default --routes all).
#   2. the MoE benchmark, every schedule (linear, shifted, topology), every combine mode (--combine
#      per_expert,per_rank,per_node: the flat per-expert copies and the hierarchical per-node relays) and, in
#      builds with UCX, both routes (--routes mpi,ucx), beside the one BSP baseline in one job; both runs with
#      emulate.sh --stats (each node's mpi0 byte counters):
#        4 nodes x 1 rank under 2 switches, node links at --rate, the spine at --spine-rate
#        2 nodes x 2 ranks under one switch, unshaped (shm inside a node, mpi or ucx between)
#      and the decode shape (128 tokens/rank, hidden 7168, bf16, top-8 of 32, no compute, topology schedule,
#      default route) on 4 nodes x 2 ranks under 2 switches, shaped like the 4 x 1 run, every combine mode.
#   3. bench/multinode_summary.py: latency table per route, MoE ubep/bsp per route, combine mode and schedule,
#      whether the topology schedule beats the best of the others, the bytes per call the bench counted
#      (dispatch/combine x on/off the node, ubep/bsp off the node), and the emulated links' counters beside
#      the off-node bytes the layers counted over the whole job.
#
# usage: bench/multinode.sh [--build DIR] [--out DIR] [--quick] [--rate R] [--spine-rate R2]
#                           [--mpi openmpi|mpich] [--tokens LIST] [--hidden H] [--iterations N] [--check]
# --quick: tiny sizes (a smoke run, about a minute); --check: the summary fails (exit 1) when a record is missing,
# or when a run across nodes did not time ubep over every route (mpi, and ucx in builds with UCX).
# Needs root and `ip netns` (emulate.sh exits 77 otherwise, and so does this script). Builds DIR
# (default build-release, Release) when its benchmarks are missing. Results: DIR/multinode/*.json, *.txt
# and summary.md (or --out).
set -euo pipefail
cd "$(dirname "$0")/.."
ME=bench/multinode.sh
INVOCATION="$ME $*"

BUILD=build-release OUT= QUICK=0 CHECK= RATE=1gbit SPINE_RATE=1gbit MPI=openmpi TOKENS=16,128 HIDDEN=2048 ITERS=20
while (($#)); do
  case $1 in
    --build) BUILD=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --check) CHECK=--check; shift ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --spine-rate) SPINE_RATE=${2:?}; shift 2 ;;
    --mpi) MPI=${2:?}; shift 2 ;;
    --tokens) TOKENS=${2:?}; shift 2 ;;
    --hidden) HIDDEN=${2:?}; shift 2 ;;
    --iterations) ITERS=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$ME: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$BUILD/multinode}

source scripts/env.sh
if [[ ! -x $BUILD/bench/ubep_moe_bench || ! -x $BUILD/bench/ubep_signal_latency ]]; then
  bash scripts/deps.sh
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUBEP_BUILD_TESTS=OFF >/dev/null
  cmake --build "$BUILD" -j "$JOBS"
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt
# The off-node routes this build has: ucx beside mpi when it was built with UCX.
ROUTES=mpi
if grep -qs '^#define UBEP_HAVE_UCX 1' "$BUILD/include/ubep/config.hpp"; then
  ROUTES=mpi,ucx
fi

EMU=(bash tests/multinode/emulate.sh --mpi "$MPI" --timeout 1200)
LAT_ARGS=(--min-size 8 --max-size 65536 --iterations 2000 --iterations-large 200 --warmup 200 --warmup-large 20)
MOE_ARGS=(--schedules linear,shifted,topology --tokens "$TOKENS" --hidden "$HIDDEN" --routing uniform,skewed
          --compute-us-per-token 0,2 --iterations "$ITERS" --warmup 2)
if ((QUICK)); then
  LAT_ARGS=(--min-size 8 --max-size 4096 --iterations 200 --warmup 20)
  MOE_ARGS=(--schedules linear,shifted,topology --tokens 16 --hidden 512 --routing uniform
            --compute-us-per-token 0 --iterations 5 --warmup 1)
fi
MOE_ARGS+=(--routes "$ROUTES" --combine per_expert,per_rank,per_node)
if [[ $MPI == mpich ]]; then
  LOCAL=(mpiexec.mpich -n 2)
else
  LOCAL=(mpirun -np 2)
fi

source bench/job.sh  # run NAME CMD...

for bench in signal_latency put_latency; do
  exe=$BUILD/bench/ubep_$bench
  run "lat_${bench}_shm" "${LOCAL[@]}" "$exe" "${LAT_ARGS[@]}"
  run "lat_${bench}_mpi1" env UBEP_TRANSPORTS=mpi "${LOCAL[@]}" "$exe" "${LAT_ARGS[@]}"
  run "lat_${bench}_node" "${EMU[@]}" --nodes 2 --rate "$RATE" -- "$exe" "${LAT_ARGS[@]}"
  run "lat_${bench}_spine" "${EMU[@]}" --nodes 2 --switches 2 --rate "$RATE" --spine-rate "$SPINE_RATE" -- \
    "$exe" "${LAT_ARGS[@]}"
done

run moe_4x1_switches "${EMU[@]}" --nodes 4 --ranks-per-node 1 --switches 2 --rate "$RATE" --spine-rate "$SPINE_RATE" \
  --stats -- "$BUILD/bench/ubep_moe_bench" "${MOE_ARGS[@]}"
run moe_2x2 "${EMU[@]}" --nodes 2 --ranks-per-node 2 --stats -- "$BUILD/bench/ubep_moe_bench" "${MOE_ARGS[@]}"
# The decode shape of issue 13 across 4 shaped nodes of 2 ranks: the per_node relays against the flat modes.
DECODE_ARGS=(--schedules topology --tokens 128 --hidden 7168 --routing uniform,skewed --compute-us-per-token 0
             --iterations 10 --warmup 1 --combine per_expert,per_rank,per_node)
if ((QUICK)); then
  DECODE_ARGS=(--schedules topology --tokens 16 --hidden 512 --routing uniform --compute-us-per-token 0
               --iterations 3 --warmup 1 --combine per_expert,per_rank,per_node)
fi
run moe_4x2_decode "${EMU[@]}" --nodes 4 --ranks-per-node 2 --switches 2 --rate "$RATE" --spine-rate "$SPINE_RATE" \
  --stats -- "$BUILD/bench/ubep_moe_bench" "${DECODE_ARGS[@]}"

{
  echo "# ubep across emulated nodes ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $MPI)"
  echo "node links --rate $RATE, spine --spine-rate $SPINE_RATE; ubep routes between nodes: $ROUTES; command: $INVOCATION"
  echo
  python3 bench/multinode_summary.py "$OUT" $CHECK --routes "$ROUTES"
} >"$OUT/summary.md"
cat "$OUT/summary.md"
