#!/usr/bin/env bash
# bench/sim/calibrate.sh: how well the simulation predicts this machine. The MoE cases of bench/multinode.sh
# (4 nodes x 1 rank under 2 switches with shaped links, 2 nodes x 2 ranks unshaped) run twice: on nodes
# emulated by tests/multinode/emulate.sh (measured) and under SimGrid's SMPI on a crossbar platform whose links
# carry the latency and bandwidth measured here a minute before (predicted); the table is predicted / measured
# per case (docs/SIMULATION.md "Simulated scale", calibration).
#
# usage: bench/sim/calibrate.sh [--build DIR] [--build-sim DIR] [--out DIR] [--rate R] [--tokens LIST]
#                               [--hidden H] [--iterations N] [--quick] [--check]
# Defaults: --build build-release (Release, built when missing, as bench/multinode.sh), --build-sim build-sim,
# --out DIR/sim-calibration, --rate 1gbit (node links and spine uplinks of the 4x1 case, as bench/multinode.sh),
# --tokens 16,128, --hidden 2048, --iterations 20.
# Steps:
#   1. links, measured with ubep_signal_latency (its MPI_Send/MPI_Recv column, osu_latency's ping-pong):
#      between two emulated nodes unshaped and at --rate, and between two ranks of this machine (on-node);
#      the same runs time ubep's put_signal over the mpi route, which the table compares too.
#      One-way latency = the 8 B time; bandwidth = 1 / the least-squares slope of time over size from 64 KiB on.
#   2. platforms (make_platform.py --topology crossbar): a node link gets half the inter-node latency (a route
#      crosses two), its bandwidth, the spine uplinks --rate; the loopback between the ranks of a node the
#      on-node latency and bandwidth; and every inter-node route crosses one shared link of the unshaped
#      bandwidth (--host-bw): the two cores that run the TCP stack of every emulated node, so that unshaped
#      nodes share one machine's TCP throughput as they do here. SMPI's latency and bandwidth factors are
#      set to 1, so a simulated ping-pong gives back the measured one (the table checks that too).
#   3. ubep_moe_bench, same arguments, emulated and simulated (BSP and ubep on the mpi route, schedules linear and
#      topology, combine per_expert and per_node).
# --quick: 16 tokens at hidden 512, 3 iterations, shorter ping-pongs (the CTest sim.calibrate.quick, ~1 min).
# --check: exit 1 when a run failed, a case has no counterpart, or a simulated ping-pong does not give back the
# link its platform was built from (calibrate_report.py); the ±25% goal is reported, not asserted.
# Needs root and `ip netns` for the emulation (exit 77 otherwise, as emulate.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
ME=bench/sim/calibrate.sh
INVOCATION="$ME $*"
BUILD=build-release BUILD_SIM=build-sim OUT= RATE=1gbit TOKENS=16,128 HIDDEN=2048 ITERS=20 CHECK= QUICK=0
while (($#)); do
  case $1 in
    --build) BUILD=${2:?}; shift 2 ;;
    --build-sim) BUILD_SIM=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --tokens) TOKENS=${2:?}; shift 2 ;;
    --hidden) HIDDEN=${2:?}; shift 2 ;;
    --iterations) ITERS=${2:?}; shift 2 ;;
    --check) CHECK=--check; shift ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$ME: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$BUILD_SIM/sim-calibration}
source scripts/env.sh
# build DIR DEPS-ENV CMAKE-FLAGS...: the two benchmarks in DIR, configured (with the flags) only when DIR is no
# build tree yet, so an existing tree keeps its own configuration.
build() {
  local dir=$1 deps=$2; shift 2
  [[ -x $dir/bench/ubep_moe_bench && -x $dir/bench/ubep_signal_latency ]] && return 0
  if [[ ! -f $dir/CMakeCache.txt ]]; then
    env $deps bash scripts/deps.sh
    cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  fi
  cmake --build "$dir" -j "$JOBS" --target ubep_moe_bench ubep_signal_latency
}
build "$BUILD" UBEP_WITH_SIMGRID=0 -DCMAKE_BUILD_TYPE=Release -DUBEP_BUILD_TESTS=OFF
build "$BUILD_SIM" UBEP_WITH_SIMGRID=1 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_SIMGRID=ON
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}

source bench/job.sh  # run NAME CMD...

EMU=(bash tests/multinode/emulate.sh --timeout 1200)
LAT=(--routes all --min-size 8 --max-size 1048576 --iterations 1000 --iterations-large 100 --warmup 100
     --warmup-large 10)
if ((QUICK)); then
  TOKENS=16 HIDDEN=512 ITERS=3
  LAT=(--routes all --min-size 8 --max-size 1048576 --iterations 200 --iterations-large 20 --warmup 20
       --warmup-large 2 --batches 3)
fi
MOE=(--tokens "$TOKENS" --hidden "$HIDDEN" --routing uniform --compute-us-per-token 0 --schedules linear,topology
     --combine per_expert,per_node --iterations "$ITERS" --warmup 2)
# Emulated, ubep between nodes on the mpi route (builds with UCX default to ucx there); SimGrid builds have
# only that route (node peers too: SMPI simulates MPI, so they reach each other through the host's loopback).
EMU_MOE=("${MOE[@]}" --routes mpi)
# SMPI as bench/sim/run.sh, plus latency and bandwidth factors of 1: the links are the measured ping-pong.
SMPI=(--cfg=network/crosstraffic:0 --cfg=smpi/simulate-computation:no --cfg=smpi/async-small-thresh:65536
      --cfg=smpi/coll-selector:ompi --cfg=smpi/alltoallv:ompi_basic_linear --cfg=smpi/test:1e-8
      --cfg=smpi/iprobe:1e-8 --cfg=smpi/privatization:dlopen --cfg=smpi/bw-factor:0:1 --cfg=smpi/lat-factor:0:1
      --log=root.thresh:critical)

# 1. links
run link_node "${EMU[@]}" --nodes 2 -- "$BUILD/bench/ubep_signal_latency" "${LAT[@]}"
run link_node_shaped "${EMU[@]}" --nodes 2 --rate "$RATE" -- "$BUILD/bench/ubep_signal_latency" "${LAT[@]}"
run link_onnode mpirun -np 2 "$BUILD/bench/ubep_signal_latency" "${LAT[@]}"
fit() { python3 bench/sim/calibrate_report.py --fit "$OUT/$1.json"; }  # prints "<one-way us> <MB/s>"
read -r NODE_LAT NODE_BW < <(fit link_node)
read -r SHAPED_LAT SHAPED_BW < <(fit link_node_shaped)
read -r ON_LAT ON_BW < <(fit link_onnode)
half() { python3 -c "print(f'{$1 / 2:.4f}us')"; }
echo "links: node ${NODE_LAT} us ${NODE_BW} MB/s; at $RATE ${SHAPED_LAT} us ${SHAPED_BW} MB/s; on-node ${ON_LAT} us ${ON_BW} MB/s" |
  tee "$OUT/links.txt" >&2

# 2. platforms: the 4x1 case on the shaped links and uplinks, the 2x2 case unshaped
PLAT=(python3 bench/sim/make_platform.py --topology crossbar --node-lat "${ON_LAT}us" --node-bw "${ON_BW}MBps")
"${PLAT[@]}" --ranks 4 --ranks-per-node 1 --switches 2 --link-lat "$(half "$SHAPED_LAT")" --link-bw "${SHAPED_BW}MBps" \
  --spine-bw "${SHAPED_BW}MBps" --host-bw "${NODE_BW}MBps" --out "$OUT/platform-4x1" >/dev/null
"${PLAT[@]}" --ranks 4 --ranks-per-node 2 --link-lat "$(half "$NODE_LAT")" --link-bw "${NODE_BW}MBps" \
  --host-bw "${NODE_BW}MBps" --out "$OUT/platform-2x2" >/dev/null
"${PLAT[@]}" --ranks 2 --ranks-per-node 1 --link-lat "$(half "$NODE_LAT")" --link-bw "${NODE_BW}MBps" \
  --out "$OUT/platform-2x1" >/dev/null
"${PLAT[@]}" --ranks 2 --ranks-per-node 1 --link-lat "$(half "$SHAPED_LAT")" --link-bw "${SHAPED_BW}MBps" \
  --out "$OUT/platform-2x1-shaped" >/dev/null
"${PLAT[@]}" --ranks 2 --ranks-per-node 2 --out "$OUT/platform-1x2" >/dev/null
sim() {
  local plat=$OUT/platform-$1; shift
  UBEP_TOPOLOGY_FILE=$plat/topology.conf smpirun -np "$(wc -l <"$plat/hostfile")" -platform "$plat/platform.xml" \
    -hostfile "$plat/hostfile" "${SMPI[@]}" "$@"
}
run sim_link_node sim 2x1 "$BUILD_SIM/bench/ubep_signal_latency" "${LAT[@]}"
run sim_link_node_shaped sim 2x1-shaped "$BUILD_SIM/bench/ubep_signal_latency" "${LAT[@]}"
run sim_link_onnode sim 1x2 "$BUILD_SIM/bench/ubep_signal_latency" "${LAT[@]}"

# 3. the MoE cases
run emu_moe_4x1 "${EMU[@]}" --nodes 4 --ranks-per-node 1 --switches 2 --rate "$RATE" --spine-rate "$RATE" -- \
  "$BUILD/bench/ubep_moe_bench" "${EMU_MOE[@]}"
run emu_moe_2x2 "${EMU[@]}" --nodes 2 --ranks-per-node 2 -- "$BUILD/bench/ubep_moe_bench" "${EMU_MOE[@]}"
run sim_moe_4x1 sim 4x1 "$BUILD_SIM/bench/ubep_moe_bench" "${MOE[@]}"
run sim_moe_2x2 sim 2x2 "$BUILD_SIM/bench/ubep_moe_bench" "${MOE[@]}"

PY=python3
[[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3
rc=0
{
  echo "# SimGrid prediction / emulated measurement ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores; $INVOCATION)"
  echo
  cat "$OUT/links.txt"
  echo
  "$PY" bench/sim/calibrate_report.py $CHECK "$OUT" || rc=$?
} >"$OUT/table.md"
cat "$OUT/table.md"
exit "$rc"
