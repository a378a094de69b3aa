#!/usr/bin/env bash
# emulate.sh: run an MPI program across N emulated nodes on this one machine.
#
# Each node is a network namespace with its own hostname (UTS namespace, set by the rsh agent), joined to
# the others by a veth link named `mpi0` on every node. All node links meet in one "fabric" namespace that
# holds the switches (Linux bridges); with --switches S > 1 the switch bridges are joined by a spine bridge.
# mpirun (Open MPI) or mpiexec.mpich (Hydra) runs inside the first node; the other nodes are reached with a
# generated rsh agent. Everything created is removed on every exit path (normal, error, Ctrl-C, TERM,
# --timeout). See docs/MULTINODE.md, section "Running across nodes".
set -u -o pipefail

ME=emulate.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<'EOF'
usage: tests/multinode/emulate.sh [options] -- <program> [args...]

Runs <program> with MPI across N emulated nodes (network namespaces, TCP over veth), then removes every
namespace, link and temporary file it created, also on failure, Ctrl-C, SIGTERM and --timeout.
Needs root and `ip netns`. Exit status: the MPI job's; 77 when this machine cannot emulate (not root, no
`ip netns`, or --delay/--spine-delay without the kernel's netem qdisc); 124 on --timeout; 2 on usage errors.

  --nodes N            emulated nodes (default 2; 1..200)
  --ranks-per-node K   MPI ranks on each node (default 1); total ranks = N*K
  --mpi openmpi|mpich  launcher: mpirun (Open MPI, default) or mpiexec.mpich (MPICH Hydra). The program must
                       be built against the same MPI.
  --delay D            added one-way latency on every node link, e.g. 50us, 1ms (tc netem; needs sch_netem)
  --rate R             rate limit of every node link, each direction, e.g. 10gbit, 500mbit (tc tbf/netem)
  --switches S         group the nodes into S switches (contiguous blocks; default 1). Nodes of one switch
                       share a bridge; switches are joined by a spine bridge.
  --spine-delay D2     extra one-way latency between nodes on different switches (tc netem; needs sch_netem)
  --spine-rate R2      rate limit of each switch's uplink to the spine, each direction (tc tbf/netem)
  --topology           write a Slurm topology.conf of the emulated switches and export UBEP_TOPOLOGY_FILE
                       to it (default with --switches >= 2, unless UBEP_TOPOLOGY_FILE is already set)
  --no-topology        never write/export the topology file
  --prefix NAME        name prefix (default ubepmn<pid>): namespaces NAME-n0.., NAME-fab; hostnames NAMEn0..
                       (a Slurm topology file names them as NAMEn[0-3]). Do not use ubepmn<digits>:
                       cleanup.sh treats those as its own and reaps them when PID <digits> is gone.
  --timeout S          kill the job after S seconds, clean up, exit 124 (default: none). Use it under CTest,
                       below the test's TIMEOUT: CTest kills with SIGKILL, which no trap can catch. Before
                       the kill, every process of the job but the launchers prints its threads' stacks
                       (gdb, where installed; stderr), so that a hang can be read from the log
  --stats              print each node's mpi0 byte and drop counters and TCP retransmissions (stderr)
                       before tearing down (also printed whenever the job fails)
  --dry-run            print the topology and the launch command, create nothing
  -v, --verbose        print every ip/tc command
  -h, --help           this text

The program sees UBEP_EMULATED_NODES=N. Passed to every rank: all UBEP_*, GTEST_* and UCX_* variables
(Open MPI also forwards OMPI_MCA_* itself; MPICH passes the whole environment). UCX_TLS and UCX_NET_DEVICES
default to tcp,self,sysv,posix,cma and mpi0 unless already set.
Hostnames, namespaces and addresses are printed in the header line on stderr.
EOF
}

die() { echo "$ME: $*" >&2; exit 2; }
cannot() { echo "$ME: cannot emulate nodes here: $*" >&2; exit 77; }

# ---------------------------------------------------------------------------------------------- options
NODES=2 RPN=1 MPI=openmpi DELAY= RATE= SWITCHES=1 SPINE_DELAY= SPINE_RATE= PREFIX= TIMEOUT=0 STATS=0
DRY=0 VERBOSE=0 TOPO=auto
while (($#)); do
  case $1 in
    --nodes) NODES=${2:?}; shift 2 ;;
    --ranks-per-node) RPN=${2:?}; shift 2 ;;
    --mpi) MPI=${2:?}; shift 2 ;;
    --delay) DELAY=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --switches) SWITCHES=${2:?}; shift 2 ;;
    --spine-delay) SPINE_DELAY=${2:?}; shift 2 ;;
    --spine-rate) SPINE_RATE=${2:?}; shift 2 ;;
    --prefix) PREFIX=${2:?}; shift 2 ;;
    --timeout) TIMEOUT=${2:?}; shift 2 ;;
    --stats) STATS=1; shift ;;
    --topology) TOPO=yes; shift ;;
    --no-topology) TOPO=no; shift ;;
    --dry-run) DRY=1; shift ;;
    --keep-env) shift ;;  # accepted for compatibility: the environment is always kept
    -v|--verbose) VERBOSE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
(($#)) || die "no program given (usage: $ME [options] -- <program> [args...])"
[[ $NODES =~ ^[0-9]+$ ]] && ((NODES >= 1 && NODES <= 200)) || die "--nodes must be 1..200"
[[ $RPN =~ ^[0-9]+$ ]] && ((RPN >= 1)) || die "--ranks-per-node must be >= 1"
[[ $SWITCHES =~ ^[0-9]+$ ]] && ((SWITCHES >= 1 && SWITCHES <= NODES)) || die "--switches must be 1..N"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds"
[[ $MPI == openmpi || $MPI == mpich ]] || die "--mpi must be openmpi or mpich"
if [[ -n $SPINE_DELAY || -n $SPINE_RATE ]] && ((SWITCHES < 2)); then
  die "--spine-delay/--spine-rate need --switches >= 2"
fi
for d in "$DELAY" "$SPINE_DELAY"; do
  [[ -z $d || $d =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "bad delay '$d' (use e.g. 50us, 1ms)"
done

# rate_bytes R: bytes per second of a tc rate (bit, kbit, mbit, gbit, tbit; bps, kbps, ... are bytes/s).
rate_bytes() {
  local r=$1 n u
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)(bit|bps)$ ]] || return 1
  n=${BASH_REMATCH[1]} u=${BASH_REMATCH[3]}
  awk -v n="$n" -v u="$u" -v k="${BASH_REMATCH[4]}" 'BEGIN {
      m = (u=="k") ? 1e3 : (u=="m") ? 1e6 : (u=="g") ? 1e9 : (u=="t") ? 1e12 : 1;
      b = n * m; if (k == "bit") b /= 8; printf "%d\n", b }'
}
for r in "$RATE" "$SPINE_RATE"; do
  [[ -z $r ]] || rate_bytes "$r" >/dev/null || die "bad rate '$r' (use e.g. 10gbit, 500mbit)"
done

PROG=$1; shift
if [[ $PROG != */* ]]; then
  p=$(command -v -- "$PROG") || die "program '$PROG' not found in PATH"
  PROG=$p
fi
[[ -x $PROG && -f $PROG ]] || die "program '$PROG' is not an executable file"
PROG=$(readlink -f -- "$PROG")  # mpirun runs in another namespace and directory: use an absolute path

case $MPI in
  openmpi) LAUNCHER=$(command -v mpirun.openmpi || command -v mpirun) || cannot "mpirun (Open MPI) not found" ;;
  mpich) LAUNCHER=$(command -v mpiexec.mpich) || cannot "mpiexec.mpich not found" ;;
esac

# ------------------------------------------------------------------------------------ naming & addresses
PREFIX=${PREFIX:-ubepmn$$}
[[ $PREFIX =~ ^[a-zA-Z][a-zA-Z0-9]*$ ]] && ((${#PREFIX} <= 40)) ||
  die "--prefix must be letters/digits, starting with a letter, at most 40 characters"
# One /24 per invocation, derived from the prefix (default: the PID): 10.A.B.0/24. The addresses exist only
# inside this invocation's namespaces, which have no route anywhere else, so traffic cannot leave them.
h=$(printf '%s' "$PREFIX" | cksum | cut -d' ' -f1)
NET="10.$(((h >> 8) % 256)).$((h % 256))"
FAB=$PREFIX-fab
NS=() HOSTS=() ADDRS=() SWOF=()
for ((i = 0; i < NODES; i++)); do
  NS+=("$PREFIX-n$i"); HOSTS+=("${PREFIX}n$i"); ADDRS+=("$NET.$((i + 1))")
  SWOF+=($((i * SWITCHES / NODES)))
done
NP=$((NODES * RPN))

# ------------------------------------------------------------------------------------------ environment
PASS_VARS=()
while IFS= read -r v; do PASS_VARS+=("$v"); done < <(compgen -e | grep -E '^(UBEP_|GTEST_|UCX_)' | sort)
export UBEP_EMULATED_NODES=$NODES
export UCX_TLS=${UCX_TLS:-tcp,self,sysv,posix,cma}
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-mpi0}
for v in UBEP_EMULATED_NODES UCX_TLS UCX_NET_DEVICES; do
  [[ " ${PASS_VARS[*]} " == *" $v "* ]] || PASS_VARS+=("$v")
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ------------------------------------------------------------------------------------------- launch cmd
TMP=
build_cmd() {
  CMD=()
  if [[ $MPI == openmpi ]]; then
    CMD=("$LAUNCHER" -np "$NP" --hostfile "$TMP/hostfile" --oversubscribe --bind-to none
         --mca plm_rsh_agent "$TMP/agent" --mca plm_rsh_no_tree_spawn 1
         --mca btl self,vader,tcp --mca btl_tcp_if_include mpi0 --mca oob_tcp_if_include mpi0
         --mca osc "${OMPI_MCA_osc:-ucx,sm}")
    # Every emulated node shares this machine's cores: with more ranks than cores, MPI's own waits
    # (collectives, and osc ucx's blocking lock/flush loops) must yield, or a waiting rank burns its whole
    # time slice while the peer it waits for cannot run (measured: BSP layer 16 ms -> 0.36 ms at 4 ranks).
    if ((NP > $(nproc))); then CMD+=(--mca mpi_yield_when_idle "${OMPI_MCA_mpi_yield_when_idle:-1}"); fi
    for v in "${PASS_VARS[@]}"; do CMD+=(-x "$v"); done
  else
    CMD=("$LAUNCHER" -launcher rsh -launcher-exec "$TMP/agent" -iface mpi0 -f "$TMP/hostfile" -n "$NP")
    for v in "${PASS_VARS[@]}"; do CMD+=(-genv "$v" "${!v}"); done
  fi
  CMD+=("$PROG" "$@")
}

if ((DRY)); then
  TMP=/tmp/$PREFIX.XXXXXX
  build_cmd "$@"
  for ((i = 0; i < NODES; i++)); do
    echo "node $i: host ${HOSTS[i]} netns ${NS[i]} mpi0 ${ADDRS[i]}/24 switch sw${SWOF[i]}"
  done
  printf 'ip netns exec %s unshare --uts --ipc sh -c '\''hostname %s; exec "$@"'\'' sh' "${NS[0]}" "${HOSTS[0]}"
  printf ' %q' "${CMD[@]}"; echo
  exit 0
fi

# ------------------------------------------------------------------------------- checks that may refuse
(($(id -u) == 0)) || cannot "needs root for network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || cannot "the 'ip' command (iproute2) is missing"
command -v unshare >/dev/null || cannot "the 'unshare' command (util-linux) is missing"
ip netns list >/dev/null 2>&1 || cannot "'ip netns' does not work"
if [[ -n $DELAY$RATE$SPINE_DELAY$SPINE_RATE ]]; then
  command -v tc >/dev/null || cannot "link shaping needs 'tc' (apt-get install -y iproute2)"
fi

host_list=${HOSTS[0]}
((NODES > 1)) && host_list="${PREFIX}n[0-$((NODES - 1))]"
shape=
[[ -n $DELAY ]] && shape+=" delay=$DELAY"
[[ -n $RATE ]] && shape+=" rate=$RATE"
((SWITCHES > 1)) && shape+=" switches=$SWITCHES"
[[ -n $SPINE_DELAY ]] && shape+=" spine-delay=$SPINE_DELAY"
[[ -n $SPINE_RATE ]] && shape+=" spine-rate=$SPINE_RATE"
echo "# emulated nodes: N=$NODES ranks/node=$RPN mpi=$MPI hosts=$host_list net=$NET.0/24" \
     "namespaces=$PREFIX-n[0-$((NODES - 1))]$shape (network namespaces, TCP over veth)" >&2

# ----------------------------------------------------------------------------------- cleanup machinery
CREATED_NS=() JOB= WATCHDOG= CLEANED=0 TIMED_OUT=0 GOT_SIGNAL=
run() { ((VERBOSE)) && echo "+ $*" >&2; "$@"; }
cleanup() {
  ((CLEANED)) && return; CLEANED=1
  trap '' INT TERM HUP
  [[ -n $WATCHDOG ]] && kill "$WATCHDOG" 2>/dev/null && wait "$WATCHDOG" 2>/dev/null
  if [[ -n $JOB ]] && kill -0 "$JOB" 2>/dev/null; then
    kill -TERM "$JOB" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$JOB" 2>/dev/null
  fi
  local ns p
  # Anything still running in our namespaces (orted, hydra proxies, ranks) belongs to this job.
  for ns in "${CREATED_NS[@]}"; do
    p=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [[ -n ${p// /} ]] && kill -KILL $p 2>/dev/null
  done
  for ns in "${CREATED_NS[@]}"; do
    for _ in $(seq 20); do [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break; sleep 0.1; done
    ip netns del "$ns" 2>/dev/null || { sleep 0.2; ip netns del "$ns" 2>/dev/null; }
  done
  [[ -n $TMP && -d $TMP ]] && rm -rf -- "$TMP"
}
on_exit() { local rc=$?; cleanup; exit "$rc"; }
# The stacks of the job's processes (not the launchers and shells): what a hang waits in. At most 8 s per
# process and 25 s in all, so that the cleanup still runs before CTest's own kill.
dump_stacks() {
  command -v gdb >/dev/null || return 0
  local ns p name start=$SECONDS
  for ns in "${CREATED_NS[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      name=$(cat "/proc/$p/comm" 2>/dev/null) || continue
      case $name in mpirun* | orterun* | orted* | prte* | mpiexec* | hydra_* | sh | bash | unshare | ip | sleep | timeout) continue ;; esac
      ((SECONDS - start < 25)) || { echo "$ME: --timeout: no time left for more stacks" >&2; return 0; }
      echo "$ME: --timeout: stacks of pid $p ($name) in $ns:" >&2
      timeout -k 2 8 gdb -p "$p" -batch -nx -ex 'thread apply all bt 24' 2>/dev/null | grep -E '^(Thread|#)' | cut -c1-200 >&2
    done
  done
}
on_signal() {
  GOT_SIGNAL=$1
  [[ $1 == TERM && -f ${TMP:-/nonexistent}/timed_out ]] && TIMED_OUT=1
  ((TIMED_OUT)) && dump_stacks
  cleanup
  if ((TIMED_OUT)); then echo "$ME: timed out after ${TIMEOUT}s; job killed, namespaces removed" >&2; exit 124; fi
  echo "$ME: got SIG$1; job killed, namespaces removed" >&2
  case $1 in INT) exit 130 ;; TERM) exit 143 ;; *) exit 129 ;; esac
}
trap on_exit EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

# Reap namespaces left by earlier invocations that were SIGKILLed (their owner PID is gone).
bash "$HERE/cleanup.sh" --stale --quiet || true

TMP=$(mktemp -d "/tmp/$PREFIX.XXXXXX")
chmod 755 "$TMP"

mkns() {
  local out
  # grep reads a captured list: under pipefail, `ip netns list | ... | grep -q` fails when grep quits first.
  if grep -qx -- "$1" <<<"$(ip netns list | awk '{print $1}')"; then
    die "namespace $1 already exists (another run with --prefix $PREFIX? tests/multinode/cleanup.sh removes leftovers)"
  fi
  out=$(run ip netns add "$1" 2>&1) || cannot "'ip netns add $1' failed: $out"
  CREATED_NS+=("$1")
  run ip -n "$1" link set lo up
}

# tc helpers. qdisc_for DEV NS DELAY RATE: netem when a delay is asked for (it also does the rate), else tbf.
NETEM_OK=
qdisc_for() {
  local ns=$1 dev=$2 delay=$3 rate=$4 bytes burst out
  [[ -z $delay && -z $rate ]] && return 0
  if [[ -n $delay ]]; then
    # limit: packets netem may hold; a delay of 1 ms at 10 Gbit/s holds ~1000 full-size packets.
    local args=(netem delay "$delay" limit 100000)
    [[ -n $rate ]] && args+=(rate "$rate")
    out=$(run ip netns exec "$ns" tc qdisc add dev "$dev" root "${args[@]}" 2>&1) && return 0
    if [[ $out == *"unknown"* ]]; then
      cannot "--delay/--spine-delay need the netem qdisc (CONFIG_NET_SCH_NETEM), which this kernel lacks" \
             "(tc said: $out); --rate/--spine-rate work without it"
    fi
    die "tc qdisc add dev $dev root ${args[*]} (netns $ns) failed: $out"
  fi
  # tbf: burst = 1 ms worth of bytes at the rate, at least 64 KiB (one GSO packet); queue at most 20 ms.
  bytes=$(rate_bytes "$rate")
  burst=$((bytes / 1000)); ((burst < 65536)) && burst=65536
  out=$(run ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms 2>&1) ||
    die "tc qdisc add dev $dev root tbf rate $rate burst $burst latency 20ms (netns $ns) failed: $out"
}

# ---------------------------------------------------------------------------------------- build fabric
mkns "$FAB"
for ((s = 0; s < SWITCHES; s++)); do
  run ip -n "$FAB" link add "sw$s" type bridge || die "cannot create bridge sw$s"
  run ip -n "$FAB" link set "sw$s" up
done
if ((SWITCHES > 1)); then
  run ip -n "$FAB" link add spine type bridge || die "cannot create bridge spine"
  run ip -n "$FAB" link set spine up
  for ((s = 0; s < SWITCHES; s++)); do
    # sw<s>up sits on switch s and carries traffic towards the spine; sp<s> sits on the spine.
    run ip -n "$FAB" link add "sw${s}up" type veth peer name "sp$s" || die "cannot create veth sw${s}up"
    run ip -n "$FAB" link set "sw${s}up" master "sw$s" up
    run ip -n "$FAB" link set "sp$s" master spine up
    qdisc_for "$FAB" "sw${s}up" "$SPINE_DELAY" "$SPINE_RATE"
    qdisc_for "$FAB" "sp$s" "" "$SPINE_RATE"
  done
fi
for ((i = 0; i < NODES; i++)); do
  mkns "${NS[i]}"
  # The node end is created directly in the node namespace with the name mpi0 on every node.
  run ip -n "$FAB" link add "n$i" type veth peer name mpi0 netns "${NS[i]}" || die "cannot create veth for node $i"
  run ip -n "$FAB" link set "n$i" master "sw${SWOF[i]}" up
  run ip -n "${NS[i]}" addr add "${ADDRS[i]}/24" dev mpi0
  run ip -n "${NS[i]}" link set mpi0 up
  qdisc_for "${NS[i]}" mpi0 "$DELAY" "$RATE"   # node -> fabric: delay (and rate)
  qdisc_for "$FAB" "n$i" "" "$RATE"             # fabric -> node: rate
done

# ------------------------------------------------------------------------------- hostfile, rsh agent
: >"$TMP/hostfile"
for ((i = 0; i < NODES; i++)); do
  if [[ $MPI == openmpi ]]; then echo "${HOSTS[i]} slots=$RPN" >>"$TMP/hostfile"
  else echo "${HOSTS[i]}:$RPN" >>"$TMP/hostfile"; fi
done
{
  echo '#!/bin/sh'
  echo '# rsh agent generated by emulate.sh: "agent <host> <command...>" runs the command, like ssh, through'
  echo '# a shell inside the node namespace of <host>, in a new UTS namespace whose hostname is <host>.'
  echo 'host=$1; shift'
  echo 'case $host in'
  for ((i = 0; i < NODES; i++)); do echo "  ${HOSTS[i]}|${ADDRS[i]}) ns=${NS[i]} ;;"; done
  echo '  *) echo "emulate.sh agent: unknown host $host" >&2; exit 255 ;;'
  echo 'esac'
  echo 'exec ip netns exec "$ns" unshare --uts --ipc sh -c '\''hostname "$0" && exec sh -c "$1"'\'' "$host" "$*"'
} >"$TMP/agent"
chmod 755 "$TMP/agent"

# Slurm topology.conf of the emulated fabric: switch s holds its block of nodes; a spine joins the switches.
if [[ $TOPO == yes || ( $TOPO == auto && $SWITCHES -gt 1 ) ]] && [[ -z ${UBEP_TOPOLOGY_FILE:-} ]]; then
  {
    echo "# Generated by emulate.sh: $NODES emulated nodes in $SWITCHES switch(es)."
    for ((s = 0; s < SWITCHES; s++)); do
      first=-1 last=-1
      for ((i = 0; i < NODES; i++)); do ((SWOF[i] == s)) && { ((first < 0)) && first=$i; last=$i; }; done
      if ((first == last)); then echo "SwitchName=sw$s Nodes=${PREFIX}n$first"
      else echo "SwitchName=sw$s Nodes=${PREFIX}n[$first-$last]"; fi
    done
    ((SWITCHES > 1)) && echo "SwitchName=spine Switches=sw[0-$((SWITCHES - 1))]"
  } >"$TMP/topology.conf"
  chmod 644 "$TMP/topology.conf"
  export UBEP_TOPOLOGY_FILE=$TMP/topology.conf
  PASS_VARS+=(UBEP_TOPOLOGY_FILE)
  echo "# topology file (UBEP_TOPOLOGY_FILE): $(grep -v '^#' "$TMP/topology.conf" | tr '\n' ';')" >&2
fi

# ------------------------------------------------------------------------------------------------ run
build_cmd "$@"
if ((VERBOSE)); then
  printf '+ ip netns exec %s unshare --uts --ipc sh -c ...hostname %s...' "${NS[0]}" "${HOSTS[0]}" >&2
  printf ' %q' "${CMD[@]}" >&2; echo >&2
fi
if ((TIMEOUT > 0)); then
  # The watchdog holds none of our output descriptors (a pipe reader would wait for it) and takes its
  # sleep down with it when cleanup kills it.
  ( trap - INT HUP EXIT; exec </dev/null >/dev/null 2>&1
    sleep "$TIMEOUT" & sp=$!
    trap 'kill $sp; exit 0' TERM
    wait $sp && : >"$TMP/timed_out" && kill -TERM $$ ) &
  WATCHDOG=$!
fi
# The launcher runs in node 0 with node 0's hostname, so it starts node 0's ranks itself. It runs in the
# background so that a signal to this script is handled at once (bash defers traps until a foreground
# child exits); stdin stays attached.
ip netns exec "${NS[0]}" unshare --uts --ipc sh -c 'hostname "$0" && exec "$@"' "${HOSTS[0]}" "${CMD[@]}" <&0 &
JOB=$!
wait "$JOB"
RC=$?
JOB=
# With --stats, and whenever the job failed: each node's traffic, and what TCP and the links lost. A stall
# of seconds between emulated nodes is most often a retransmission timeout (TCP backs off exponentially).
if ((STATS || RC != 0)); then
  for ((i = 0; i < NODES; i++)); do
    read -r rx tx rxd txd < <(ip netns exec "${NS[i]}" sh -c 'cd /sys/class/net/mpi0/statistics &&
      cat rx_bytes tx_bytes rx_dropped tx_dropped' | tr '\n' ' ')
    tcp=$(ip netns exec "${NS[i]}" awk '$1 == "Tcp:" { if (!n++) for (f = 2; f <= NF; f++) k[f] = $f;
      else for (f = 2; f <= NF; f++) if (k[f] == "RetransSegs") printf "%s", $f }
      $1 == "TcpExt:" { if (!m++) for (f = 2; f <= NF; f++) e[f] = $f;
      else for (f = 2; f <= NF; f++) if (e[f] == "TCPTimeouts" || e[f] == "TCPLossProbes") printf " %s=%s", e[f], $f }' \
      /proc/net/snmp /proc/net/netstat 2>/dev/null)
    echo "# node $i ${HOSTS[i]} mpi0: rx_bytes=$rx tx_bytes=$tx rx_dropped=$rxd tx_dropped=$txd; tcp RetransSegs=$tcp" >&2
  done
fi
exit "$RC"
