#!/usr/bin/env bash
# bench/sim/run.sh: ubep_moe_bench (the BSP baseline, ubep per schedule and per combine mode, per_node being
# the hierarchical path) on simulated clusters under SimGrid's SMPI, at 64..1024 ranks, decode and prefill
# shapes; a table and a plot of simulated layer time per implementation vs ranks, and the wall time of every
# simulation (docs/SIMULATION.md "Simulated scale").
#
# usage: bench/sim/run.sh [--build DIR] [--out DIR] [--ranks LIST] [--shapes decode,prefill]
#                         [--topology fat-tree|dragonfly|crossbar] [--ranks-per-node R] [--nodes-per-switch S]
#                         [--wall-limit SECONDS] [--schedules LIST] [--combine LIST] [--iterations N] [--quick]
#                         [--check]
#                         [-- extra platform.py flags, e.g. --link-bw 200Gbps --spines 1]
# Defaults: build-sim (configured and built when missing), out DIR/sim-scale, ranks 64,128,256,512,1024,
# shapes decode,prefill, fat-tree of 8 ranks per node and 4 nodes per leaf (2:1 spines), wall limit 900 s per
# simulation, schedules linear,topology, combine per_expert,per_node, 2 timed iterations + 1 warm-up.
# Shapes (hidden reduced from DeepSeek's 7168: at 7168 a simulated rank holds ~190 MB, so 1024 of them do not
# fit in this machine's 24 GiB; every simulated rank lives in this one process):
#   decode   32 tokens/rank, hidden 1024, bf16, top-8, one expert per rank, no expert compute
#   prefill 256 tokens/rank, hidden 1024, bf16, top-8, one expert per rank, no expert compute
#            (memory: run only up to UBEP_SIM_PREFILL_MAX_RANKS, default 128)
# Beside every ubep_moe_bench run, ubep_sim_bsp_alone simulates the BSP baseline's communication alone (no ubep
# code; the same shape, platform, settings and wall limit): its wall time is SimGrid's price of the all-to-all
# itself at that scale. A simulation that passes the wall limit is stopped and reported as such; the table says so.
# --check: exit 1 when a simulation failed, stopped at the wall limit or saw other than ranks/ranks-per-node nodes.
# --quick: 16 and 32 ranks (4 per node, 2 nodes per leaf), the decode shape with 8 tokens per rank (a smoke run).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build-sim OUT= RANKS=64,128,256,512,1024 SHAPES=decode,prefill TOPO=fat-tree RPN=8 NPS=4 LIMIT=900
SCHEDULES=linear,topology COMBINE=per_expert,per_node ITERS=2 QUICK=0 CHECK= EXTRA=()
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --topology) TOPO=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --nodes-per-switch) NPS=$2; shift 2 ;;
    --wall-limit) LIMIT=$2; shift 2 ;;
    --schedules) SCHEDULES=$2; shift 2 ;;
    --combine) COMBINE=$2; shift 2 ;;
    --iterations) ITERS=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --check) CHECK=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "bench/sim/run.sh: unknown argument '$1' (see the header of this script)" >&2; exit 2 ;;
  esac
done
if ((QUICK)); then RANKS=16,32 SHAPES=decode RPN=4 NPS=2; fi
OUT=${OUT:-$BUILD/sim-scale}
mkdir -p "$OUT"
source scripts/env.sh
if [[ ! -x $BUILD/bench/ubep_moe_bench ]]; then
  UBEP_WITH_SIMGRID=1 bash scripts/deps.sh
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_SIMGRID=ON >/dev/null
  cmake --build "$BUILD" -j "$JOBS" --target ubep_moe_bench
fi
for prog in ubep_sim_rma_cost ubep_sim_bsp_alone; do
  if [[ ! -x $BUILD/bench/$prog ]]; then cmake --build "$BUILD" -j "$JOBS" --target "$prog"; fi
done
BENCH=$BUILD/bench/ubep_moe_bench
# SMPI settings (docs/SIMULATION.md "Scale runs" says why): eager messages up to 64 KiB (SMPI's default waits for the
# posted receive, which serialises ubep's one-receive signal inbox); Open MPI's collective algorithms, with
# MPI_Alltoallv its basic linear one (every Isend/Irecv at once); 10 ns per MPI_Test/MPI_Iprobe (default
# 100 us, for busy-polling programs: ubep's simulated waits block); no reverse (ACK) flow per message and no
# CPU time of the code between MPI calls (deterministic; both cut the wall time), so the simulated time is
# the network's alone.
SMPI=(--cfg=network/crosstraffic:0 --cfg=smpi/simulate-computation:no --cfg=smpi/async-small-thresh:65536 --cfg=smpi/coll-selector:ompi --cfg=smpi/alltoallv:ompi_basic_linear --cfg=smpi/test:1e-8 --cfg=smpi/iprobe:1e-8 --cfg=smpi/privatization:dlopen --log=root.thresh:critical)
: >"$OUT/runs.jsonl"
# simulate LOG PROGRAM ARGS...: PROGRAM under smpirun on $plat with $np ranks, stopped at the wall limit, its
# output in $OUT/LOG; sets wall (seconds) and status (ok, stopped at the wall limit, or failed).
simulate() {
  local log=$1 start rc=0
  shift
  start=$(date +%s.%N)
  timeout "$LIMIT" smpirun -np "$np" -platform "$plat/platform.xml" -hostfile "$plat/hostfile" "${SMPI[@]}" "$@" \
    >"$OUT/$log" 2>&1 || rc=$?
  wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  if ((rc == 124)); then
    status="stopped at the wall limit (${LIMIT} s)"
  elif ((rc != 0)); then
    status="failed (exit $rc, see $log)"
  else
    status=ok
  fi
}
# What SMPI charges for ubep's mpi-route protocol (put, flush per peer, signal message) against the same bytes
# as messages, once, on the platform of the smallest scale (ubep_sim_rma_cost; the table quotes it).
np=${RANKS%%,*}
plat=$OUT/platform-$TOPO-np$np
python3 bench/sim/make_platform.py --topology "$TOPO" --ranks "$np" --ranks-per-node "$RPN" \
  --nodes-per-switch "$NPS" "${EXTRA[@]}" --out "$plat" >/dev/null
smpirun -np "$np" -platform "$plat/platform.xml" -hostfile "$plat/hostfile" "${SMPI[@]}" \
  "$BUILD/bench/ubep_sim_rma_cost" --bytes 8192 >"$OUT/rma_cost.txt" 2>&1 || true
cat "$OUT/rma_cost.txt"
for shape in ${SHAPES//,/ }; do
  case $shape in
    decode) TOKENS=32 HIDDEN=1024; ((QUICK)) && TOKENS=8 ;;
    prefill) TOKENS=256 HIDDEN=1024 ;;
    *) echo "bench/sim/run.sh: unknown shape '$shape' (decode, prefill)" >&2; exit 2 ;;
  esac
  for np in ${RANKS//,/ }; do
    tag=$shape-$TOPO-np$np
    if [[ $shape == prefill && $np -gt ${UBEP_SIM_PREFILL_MAX_RANKS:-128} ]]; then
      status="not run: memory (prefill above UBEP_SIM_PREFILL_MAX_RANKS=${UBEP_SIM_PREFILL_MAX_RANKS:-128} ranks)"
      echo "== $tag: $status"
      printf '{"shape":"%s","ranks":%d,"status":"%s","wall_s":0,"json":""}\n' "$shape" "$np" "$status" >>"$OUT/runs.jsonl"
      continue
    fi
    plat=$OUT/platform-$TOPO-np$np
    python3 bench/sim/make_platform.py --topology "$TOPO" --ranks "$np" --ranks-per-node "$RPN" \
      --nodes-per-switch "$NPS" "${EXTRA[@]}" --out "$plat" >/dev/null
    echo "== $tag: $(cat "$plat/description.json" | tr -d '\n ')"
    # The BSP baseline's communication alone (ubep_sim_bsp_alone, no ubep code) first: the wall time SimGrid
    # takes for the all-to-all itself at this scale, which bounds what any implementation's simulation costs.
    simulate "$tag.bsp_alone.txt" "$BUILD/bench/ubep_sim_bsp_alone" --tokens "$TOKENS" --hidden "$HIDDEN" --topk 8 \
      --iterations "$ITERS"
    alone=$status alone_wall=$wall
    alone_us=$(sed -n 's/.*: layer \([0-9.]*\) us.*/\1/p' "$OUT/$tag.bsp_alone.txt")
    [[ $alone == ok && -z $alone_us ]] && alone="failed (no layer time, see $tag.bsp_alone.txt)"
    echo "   BSP alone (no ubep): $alone, ${alone_us:-no} simulated us, wall ${alone_wall} s"
    UBEP_TOPOLOGY_FILE=$plat/topology.conf simulate "$tag.txt" "$BENCH" --tokens "$TOKENS" --hidden "$HIDDEN" \
      --topk 8 --experts "$np" --routing uniform --compute-us-per-token 0 --iterations "$ITERS" --warmup 1 \
      --schedules "$SCHEDULES" --combine "$COMBINE" --json "$OUT/$tag.json"
    echo "   $status, wall ${wall} s"
    printf '{"shape":"%s","ranks":%d,"status":"%s","wall_s":%s,"json":"%s","topology":"%s","tokens":%d,"hidden":%d,"nodes":%d,"alone_status":"%s","alone_wall_s":%s,"alone_us":%s}\n' \
      "$shape" "$np" "$status" "$wall" "$tag.json" "$TOPO" "$TOKENS" "$HIDDEN" "$((np / RPN))" "$alone" "$alone_wall" \
      "${alone_us:-null}" >>"$OUT/runs.jsonl"
  done
done
PY=python3
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c "import matplotlib" 2>/dev/null && PY=/usr/bin/python3  # Debian's, with matplotlib
"$PY" bench/sim/report.py ${CHECK:+--check} "$OUT"
