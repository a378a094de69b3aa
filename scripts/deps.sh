#!/usr/bin/env bash
# Installs the Debian packages ubep needs, only those that are missing. Safe to run again.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libopenmpi-dev openmpi-bin libhwloc-dev hwloc libucx-dev ucx-utils
          libnuma-dev libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev clang-format clang iproute2
          gnuplot-nox python3 python3-matplotlib doxygen)
if [[ "${UBEP_WITH_MPICH:-0}" == 1 ]]; then packages+=(libmpich-dev mpich); fi
if [[ "${UBEP_WITH_SIMGRID:-0}" == 1 ]]; then packages+=(libsimgrid-dev); fi  # SMPI: it ships smpicxx and smpirun
missing=()
for p in "${packages[@]}"; do
  [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == *"install ok installed"* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ubep: installing missing packages: ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
