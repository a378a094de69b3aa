#!/usr/bin/env bash
# soak.selfcheck: shows that ubep-stress's checks can fail. Rank 0 breaks one thing on purpose (--inject: a
# flipped byte, a put never issued, a signal too many, an unplanned add, an unlogged swap or compare-and-swap
# increment, a stale get region, a wrong MoE expert output); each run must end with status 1, "FAILED" and
# at least one MISMATCH line naming what broke. A control run without a fault must pass.
# usage: selfcheck.sh <launcher and its flags...> -- <ubep-stress>
set -u
launcher=()
while [[ $# -gt 0 && $1 != "--" ]]; do launcher+=("$1"); shift; done
shift
exe=$1
args=(--rounds 8 --moe-every 2 --stall-every 0 --print-limit 1 --report-every 0 --max-bytes 16384)
declare -A expect=(
  [data]="checked after the writer's signal|checked after the writer's quiet"
  [stale]="match round"
  [signal]="signal word of rank 0"
  [counter]="add word 0"
  [swap]="tokens differ"
  [cas]="successful increments"
  [get]="get.* from rank 0"
  [moe]="Layer differs from BspLayer"
)
fail=0
out=$("${launcher[@]}" "$exe" "${args[@]}" 2>&1)
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q "ubep-stress: PASSED" <<<"$out"; then
  echo "selfcheck: the control run (no fault) did not pass (status $rc):"; echo "$out" | tail -20; fail=1
else
  echo "selfcheck: control run passed"
fi
for kind in data stale signal counter swap cas get moe; do
  out=$("${launcher[@]}" "$exe" "${args[@]}" --inject "$kind" 2>&1)
  rc=$?
  line=$(grep -m1 "MISMATCH" <<<"$out")
  if [[ $rc -eq 1 ]] && grep -q "ubep-stress: FAILED" <<<"$out" && grep -Eq "${expect[$kind]}" <<<"$line"; then
    echo "selfcheck: --inject $kind detected: ${line:0:240}"
  else
    echo "selfcheck: --inject $kind NOT detected as expected (status $rc):"; echo "$out" | tail -20; fail=1
  fi
done
[[ $fail -eq 0 ]] && echo "selfcheck: every fault was detected"
exit $fail
