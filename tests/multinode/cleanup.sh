#!/usr/bin/env bash
# cleanup.sh: remove network namespaces (and temp dirs) left behind by tests/multinode/emulate.sh.
# emulate.sh removes what it creates on every exit path it can see; only SIGKILL (e.g. a CTest timeout
# without emulate.sh --timeout) or a crash of the machine leaves something behind.
#   cleanup.sh            remove leftovers of runs whose emulate.sh process is gone (safe while others run)
#   cleanup.sh --all      remove every ubepmn* namespace, also those of runs still going
#   cleanup.sh --prefix NAME   remove NAME-* namespaces (runs started with emulate.sh --prefix NAME)
#   --quiet               print nothing;  --dry-run   only list what would be removed
set -u
MODE=stale PREFIX= QUIET=0 DRY=0
while (($#)); do
  case $1 in
    --stale) MODE=stale; shift ;;
    --all) MODE=all; shift ;;
    --prefix) MODE=prefix; PREFIX=${2:?}; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cleanup.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
(($(id -u) == 0)) || { ((QUIET)) || echo "cleanup.sh: needs root" >&2; exit 77; }
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || exit 0

owner_alive() {  # owner_alive PID: is PID an emulate.sh process?
  [[ -r /proc/$1/cmdline ]] && tr '\0' ' ' </proc/$1/cmdline | grep -q 'emulate\.sh'
}
victims=()
for ns in $(ip netns list | awk '{print $1}'); do
  case $MODE in
    prefix) [[ $ns == "$PREFIX"-* ]] && victims+=("$ns") ;;
    all) [[ $ns == ubepmn* ]] && victims+=("$ns") ;;  # custom prefixes too (selftest: ubepmnst*)
    stale) [[ $ns =~ ^ubepmn([0-9]+)- ]] && ! owner_alive "${BASH_REMATCH[1]}" && victims+=("$ns") ;;
  esac
done
rc=0
for ns in "${victims[@]}"; do
  ((QUIET)) || echo "cleanup.sh: removing namespace $ns" >&2
  ((DRY)) && continue
  p=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  [[ -n ${p// /} ]] && kill -KILL $p 2>/dev/null
  ip netns del "$ns" 2>/dev/null || { sleep 0.2; ip netns del "$ns" || rc=1; }
done
# Temp dirs (hostfile, agent) of runs that are gone.
for d in /tmp/ubepmn*.??????; do
  [[ -d $d ]] || continue
  if [[ $MODE == all || ( $MODE == stale && $d =~ ^/tmp/ubepmn([0-9]+)\. && ! -e /proc/${BASH_REMATCH[1]} ) ]]; then
    ((QUIET)) || echo "cleanup.sh: removing $d" >&2
    ((DRY)) || rm -rf -- "$d"
  fi
done
if [[ $MODE == prefix ]]; then
  for d in /tmp/"$PREFIX".??????; do [[ -d $d ]] && { ((DRY)) || rm -rf -- "$d"; }; done
fi
exit $rc
