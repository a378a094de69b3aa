#!/usr/bin/env bash
# clang-format over the project's C++ sources. --check fails (and lists files) when one is not formatted.
set -euo pipefail
cd "$(dirname "$0")/.."
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
