# bench/job.sh: sourced by bench/multinode.sh and bench/sim/calibrate.sh (which set ME and OUT).
# run NAME CMD...: runs one job with --json OUT/NAME.json appended, its output in OUT/NAME.txt. Exits 77 when the
# job could not emulate nodes (emulate.sh's 77), and with the job's status (its last 30 lines on stderr) when it
# failed or wrote no JSON (smpirun can exit 0 after a failed rank).
run() {
  local name=$1; shift
  echo "== $name: $*" >&2
  local rc=0
  "$@" --json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1 || rc=$?
  if ((rc == 77)); then
    echo "$ME: cannot emulate nodes here (see $OUT/$name.txt)" >&2
    tail -n 3 "$OUT/$name.txt" >&2
    exit 77
  fi
  if ((rc == 0)) && [[ ! -s $OUT/$name.json ]]; then rc=1; fi
  if ((rc != 0)); then
    echo "$ME: $name failed (exit $rc); its output:" >&2
    tail -n 30 "$OUT/$name.txt" >&2
    exit "$rc"
  fi
}
