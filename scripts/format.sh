#!/usr/bin/env bash
# clang-format over the project's C++ sources, and the README's "Running across nodes" section from
# docs/MULTINODE.md (scripts/readme_sync.py). --check fails (and lists files) when one is not up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == --check ]]; then python3 scripts/readme_sync.py --check; else python3 scripts/readme_sync.py; fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.h' '*.c' 2>/dev/null || true)
((${#files[@]})) || exit 0
if [[ "${1:-}" == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    [[ -f "$f" ]] || continue
    clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "not clang-formatted (run scripts/format.sh): ${bad[*]}" >&2
    exit 1
  fi
  echo "format ok (${#files[@]} files)"
else
  clang-format --style=file -i "${files[@]}"
fi
