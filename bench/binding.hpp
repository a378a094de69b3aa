/// \file binding.hpp
/// Where the benchmark's ranks run (--bind): latency on one node depends on whether two ranks own their
/// cores or share them, so the OSU-style benchmarks bind by default, and say in their header what they did.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace ubep::bench {

/// What bind_ranks() did.
struct Binding {
  /// "auto" or "none" (the --bind flag).
  std::string mode;
  /// "ubep" (bound here, one core per rank), "launcher" (the ranks arrived bound to different CPUs, kept),
  /// or "none" (unbound: --bind none, or fewer cores than ranks on a host).
  std::string by;
  /// One line for the header: what was done and why.
  std::string summary;
  /// Per world rank: the CPUs it may run on after binding, e.g. "0" or "0-1" (only rank 0 holds them).
  std::vector<std::string> cpus;
};

/// Collective over `comm`, before any Context exists. With mode "auto": when the ranks of one host (ranks
/// with the same Linux boot id: emulated nodes share a host) all arrived with the same CPU set and it holds
/// at least as many physical cores as there are such ranks, binds the i-th rank of the host (in rank order)
/// to the first CPU of the i-th core of that set, every thread of the process (the threads MPI started
/// too; later ones inherit it); when they arrived bound to different CPUs, keeps the launcher's binding;
/// otherwise leaves them unbound. Mode "none" changes nothing. Linux only (sched_setaffinity, sysfs).
Binding bind_ranks(const std::string& mode, MPI_Comm comm);

}  // namespace ubep::bench
