#!/usr/bin/env bash
# Runs one fault case of tests/faults/fault_job.cpp as a real MPI job and checks what a user sees.
#
#   run_fault.sh --job <fault_job> --mpiexec <mpirun|mpiexec.mpich> --fault F --point P [options]
#
# Options:
#   --np N             ranks (2)
#   --victim V         the failing rank (1)
#   --detect ubep|launcher|any
#                      who must end the job: `ubep` = a survivor reports ubep's Errc::timeout naming rank V
#                      ("fault_job: rank R detected ..."), then MPI_Abort; `launcher` = mpirun/mpiexec ends
#                      the job and its report names rank V; `any` = either
#   --launch default|survive|recovery
#                      Open MPI: `default` as a user runs it; `survive` keeps the survivors running when a rank
#                      dies by a signal or exits non-zero (orte_abort_on_non_zero_status=0); `recovery` also
#                      after an exit(0) without MPI_Finalize (orte_enable_recovery=1: Open MPI 4.1 then loses
#                      the job's exit status, see --rc). MPICH: `survive`/`recovery` = -disable-auto-cleanup
#   --rc nonzero|N     the job's exit status must be non-zero (default) or exactly N
#   --wait-timeout S   UBEP_WAIT_TIMEOUT for the job (3)
#   --detect-bound D   ubep detection: the first survivor's error must come within UBEP_WAIT_TIMEOUT + D
#                      seconds of the fault (default 1.5: the collectives' roll call takes up to 1 s)
#   --bound B          the job must end within UBEP_WAIT_TIMEOUT + B seconds of the fault, whoever detects
#                      it (default 15: after ubep's error the launcher takes the job down, 0.05 - 2 s on an
#                      idle machine, up to 11 s measured while other jobs loaded the 2 cores 8x)
#   --emulate N        run across N emulated nodes (tests/multinode/emulate.sh), --ranks-per-node K each
#   --ranks-per-node K with --emulate (1)
#   --env VAR=value    extra environment for the job (repeatable; e.g. UBEP_TRANSPORTS=mpi)
#   --hard S           outer wall-clock limit of the whole job (default UBEP_WAIT_TIMEOUT + bound + 30)
#   --core-limit L     `ulimit -c` for the job (default: unlimited if the hard limit allows, so that a core
#                      dump cannot hide; FAULT_CORE_LIMIT overrides)
# Prints one line "fault_result ..." with the measured time to detect (fault to end of job) and exits 0
# when every check passed, 1 otherwise.
set -u

job='' mpiexec='' fault='' point='' np=2 victim=1 detect=ubep launch=default rc_want=nonzero wait_timeout=3 bound=15 detect_bound=1.5
emulate=0 rpn=1 hard='' core_limit=${FAULT_CORE_LIMIT:-} extra_env=()
here=$(cd "$(dirname "$0")" && pwd)
while (($#)); do
  case $1 in
    --job) job=$2; shift ;;
    --mpiexec) mpiexec=$2; shift ;;
    --fault) fault=$2; shift ;;
    --point) point=$2; shift ;;
    --np) np=$2; shift ;;
    --victim) victim=$2; shift ;;
    --detect) detect=$2; shift ;;
    --launch) launch=$2; shift ;;
    --rc) rc_want=$2; shift ;;
    --wait-timeout) wait_timeout=$2; shift ;;
    --bound) bound=$2; shift ;;
    --detect-bound) detect_bound=$2; shift ;;
    --emulate) emulate=$2; shift ;;
    --ranks-per-node) rpn=$2; shift ;;
    --env) extra_env+=("$2"); shift ;;
    --hard) hard=$2; shift ;;
    --core-limit) core_limit=$2; shift ;;
    -h | --help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "run_fault.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [[ -z $job || -z $mpiexec || -z $fault || -z $point ]]; then
  echo "run_fault.sh: --job, --mpiexec, --fault and --point are required" >&2
  exit 2
fi
((emulate > 0)) && np=$((emulate * rpn))
[[ -n $hard ]] || hard=$(awk -v t="$wait_timeout" -v b="$bound" 'BEGIN { printf "%d", t + b + 30 }')

is_ompi=1
"$mpiexec" --version 2>&1 | grep -qE 'Open MPI|OpenRTE' || is_ompi=0

work=$(mktemp -d "${TMPDIR:-/tmp}/ubep-fault.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/job.log

# The job's environment: short deadlines, a small heap, what the user asked for.
export UBEP_WAIT_TIMEOUT=$wait_timeout UBEP_HEAP_SIZE=${UBEP_HEAP_SIZE:-16M}
# A stalled (or computing) victim wakes up a little after the survivors must have ended the job (then it would pass).
export FAULT_STALL_S=${FAULT_STALL_S:-$(awk -v t="$wait_timeout" -v b="$detect_bound" 'BEGIN { print t + b + 1 }')}
for kv in "${extra_env[@]+"${extra_env[@]}"}"; do export "${kv?}"; done
launch_args=()
if ((is_ompi)); then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_osc=${OMPI_MCA_osc:-ucx,sm}
  case $launch in
    default) ;;
    survive) export OMPI_MCA_orte_abort_on_non_zero_status=0 ;;
    recovery) export OMPI_MCA_orte_enable_recovery=1 ;;
    *) echo "run_fault.sh: --launch default|survive|recovery" >&2; exit 2 ;;
  esac
else
  [[ $launch == default ]] || launch_args=(-disable-auto-cleanup)
fi

# Core files: allow them (unless told otherwise), so that a crash shows up as a file in $work.
if [[ -z $core_limit ]]; then
  core_limit=$(ulimit -H -c)
fi
ulimit -S -c "$core_limit" 2>/dev/null || true

cd "$work" || exit 1
start=$(date +%s.%N)
if ((emulate > 0)); then
  mpi_kind=openmpi
  ((is_ompi)) || mpi_kind=mpich
  # emulate.sh passes OMPI_MCA_* through mpirun; for MPICH its own launcher line is fixed.
  timeout -k 5 "$hard" bash "$here/../multinode/emulate.sh" --mpi "$mpi_kind" --nodes "$emulate" \
    --ranks-per-node "$rpn" --timeout "$hard" -- "$job" "$fault" "$point" "$victim" >"$log" 2>&1
  rc=$?
else
  if ((is_ompi)); then
    timeout -k 5 "$hard" "$mpiexec" -np "$np" --oversubscribe "$job" "$fault" "$point" "$victim" >"$log" 2>&1
  else
    timeout -k 5 "$hard" "$mpiexec" "${launch_args[@]+"${launch_args[@]}"}" -n "$np" "$job" "$fault" "$point" \
      "$victim" >"$log" 2>&1
  fi
  rc=$?
fi
end=$(date +%s.%N)
cd - >/dev/null || exit 1

fail=0
problem() {
  echo "FAIL: $*"
  fail=1
}
fault_t=$(sed -n 's/^.*fault_job: FAULT .* t=\([0-9.]*\)$/\1/p' "$log" | head -1)
total=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
if [[ -z $fault_t ]]; then
  if [[ $fault != none ]]; then problem "the victim never reached the fault (no 'fault_job: FAULT' line)"; fi
  detect_s=-1
else
  detect_s=$(awk -v a="$fault_t" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
fi

# Who ended the job, and does the report name the victim? A survivor's report is its "detected" line and
# the lines that follow it (ubep's wait reports list the signals and "peers that have not written: rank V"),
# without ubep's own prefix "ubep: rank R:" (R is the reporter).
# (A stalled victim that wakes up before the launcher kills it may report errors of its own: not counted.)
ubep_lines=$(grep -E '^fault_job: rank [0-9]+ detected the failure' "$log" | grep -vE "^fault_job: rank $victim " || true)
named_by_ubep=0
awk -v v="$victim" '/^fault_job: rank [0-9]+ detected the failure/ && $3 != v { on = 1; sub(/^.*ubep: rank [0-9]+: /, ""); print; next }
     /^(fault_job:|-----|\[)/ { on = 0 } on' "$log" >"$work/reports"
grep -qE "rank( [0-9]+)* $victim([^0-9]|$)" "$work/reports" && named_by_ubep=1
first_t=$(sed -n 's/^fault_job: rank [0-9]* detected the failure after [0-9.]* s (t=\([0-9.]*\),.*/\1/p' <<<"$ubep_lines" |
  sort -n | head -1)
survivor_s=-1
[[ -n $first_t && -n $fault_t ]] && survivor_s=$(awk -v a="$fault_t" -v b="$first_t" 'BEGIN { printf "%.2f", b - a }')
named_by_launcher=0
# Open MPI: "process rank V with PID ..." or "Process name: [[job,1],V]"; MPICH (Hydra) names the process by
# its pid ("PID 1234 RUNNING AT host"), which the victim printed beside its rank.
victim_pid=$(sed -n 's/^.*fault_job: FAULT .* pid \([0-9]*\) t=.*$/\1/p' "$log" | head -1)
grep -qE "(process rank|rank) $victim (with PID|on node|exited)|Process name: \[\[[0-9]+,[0-9]+\],$victim\]" "$log" &&
  named_by_launcher=1
[[ -n $victim_pid ]] && grep -qE "PID $victim_pid RUNNING AT" "$log" && named_by_launcher=1
detector=none
[[ -n $ubep_lines ]] && detector=ubep
[[ $detector == none ]] && ((named_by_launcher)) && detector=launcher

if [[ $fault == none ]]; then
  [[ $rc == 0 ]] || problem "the job without a fault exited $rc"
  grep -q 'fault_job: all ranks passed' "$log" || problem "no 'all ranks passed' line"
else
  case $detect in
    ubep)
      [[ -n $ubep_lines ]] || problem "no survivor reported ubep's error"
      ((named_by_ubep)) || problem "ubep's report does not name rank $victim"
      grep -qE 'Errc::(timeout|unreachable)\)' <<<"$ubep_lines" ||
        problem "the survivors' error is not Errc::timeout or Errc::unreachable"
      dlimit=$(awk -v t="$wait_timeout" -v b="$detect_bound" 'BEGIN { print t + b }')
      if [[ $survivor_s != -1 ]] && awk -v d="$survivor_s" -v l="$dlimit" 'BEGIN { exit !(d > l) }'; then
        problem "the first survivor reported ${survivor_s} s after the fault, more than UBEP_WAIT_TIMEOUT + ${detect_bound} s"
      fi
      limit=$(awk -v t="$wait_timeout" -v b="$bound" 'BEGIN { print t + b }')
      ;;
    launcher)
      ((named_by_launcher)) || problem "the launcher's report does not name rank $victim"
      limit=$(awk -v t="$wait_timeout" -v b="$bound" 'BEGIN { print t + b }')  # the same promise, met early
      ;;
    any)
      ((named_by_ubep || named_by_launcher)) || problem "neither ubep nor the launcher named rank $victim"
      limit=$(awk -v t="$wait_timeout" -v b="$bound" 'BEGIN { print t + b }')
      ;;
    *) echo "run_fault.sh: --detect ubep|launcher|any" >&2; exit 2 ;;
  esac
  if [[ $rc_want == nonzero ]]; then
    [[ $rc != 0 ]] || problem "the job exited 0 after a fault"
  else
    [[ $rc == "$rc_want" ]] || problem "the job exited $rc, expected $rc_want"
  fi
  if [[ $detect_s != -1 ]] && awk -v d="$detect_s" -v l="$limit" 'BEGIN { exit !(d > l) }'; then
    problem "the job ended ${detect_s} s after the fault, more than the bound of ${limit} s"
  fi
fi
if awk -v d="$total" -v h="$hard" 'BEGIN { exit !(d >= h - 0.5) }'; then
  problem "the job hung: killed by the outer timeout after ${hard} s"
fi
cores=$(find "$work" -maxdepth 2 -name 'core*' -type f | wc -l)
((cores == 0)) || problem "$cores core file(s) in the working directory"
storm=$(grep -cE 'Process received signal|Segmentation fault|core dumped|terminate called|Backtrace|Assertion .* failed|^\[[^]]*\] *\[ *[0-9]+\] ' "$log" || true)
((storm == 0)) || problem "$storm line(s) of crash reports or stack traces"
banners=$(grep -c 'MPI_ABORT was invoked' "$log" || true)
((banners <= 1)) || problem "$banners MPI_ABORT banners (one per rank: a storm)"

echo "fault_result fault=$fault point=$point np=$np victim=$victim launch=$launch detect=$detect detector=$detector" \
  "rc=$rc detect_s=$detect_s survivor_s=$survivor_s total_s=$total wait_timeout=$wait_timeout limit=${limit:-} cores=$cores" \
  "env=${extra_env[*]+"${extra_env[*]}"} emulate=$emulate"
if ((fail)) || [[ -n ${FAULT_VERBOSE:-} ]]; then
  echo "---- job output ($log) ----"
  cat "$log"
fi
exit $fail
