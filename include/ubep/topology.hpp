/// \file topology.hpp
/// Who is close to whom. Built once per Context (one allgather of a compact record per rank), then
/// read-only. Pure data: the schedule and ranking functions below need no MPI and are tested without it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ubep/options.hpp"  // ScheduleKind

namespace ubep {

/// Distance between two ranks as an ordered class; lower is closer.
enum class Distance : std::uint8_t {
  self,     ///< the same rank
  core,     ///< same physical core (hyperthreads)
  l3,       ///< same last-level cache
  numa,     ///< same NUMA node
  package,  ///< same package (socket)
  node,     ///< same host, different package (or binding unknown)
  switch_,  ///< different host, same leaf switch (from UBEP_TOPOLOGY_FILE)
  system,   ///< different host, farther or unknown
};
const char* to_string(Distance d) noexcept;

/// Where one rank runs. Indices are hwloc logical indices on its host, -1 when unknown (unbound rank,
/// or no hwloc).
struct RankPlace {
  int rank = 0;
  std::string host;    ///< real host name, or "vnodeK" under UBEP_VIRTUAL_NODES
  int node = 0;        ///< dense node id, 0..num_nodes-1, in order of first rank
  bool bound = false;  ///< the rank is bound to a strict subset of its host's PUs
  std::string cpuset;  ///< bound cpuset as a list string ("0-3"), empty when unbound
  int package = -1, numa = -1, l3 = -1, core = -1, pu = -1;
  int gpu = -1;     ///< nearest GPU (CUDA device index), -1 when none
  std::string nic;  ///< nearest network device name, empty when none
};

class Topology {
 public:
  Topology() = default;
  /// Builds the matrices from gathered places. `switch_hops[a][b]` (host-level, may be empty) gives
  /// the number of switch hops between nodes a and b from a Slurm topology file: 0 = same host,
  /// 1 = same leaf switch (Distance::switch_), larger = Distance::system.
  Topology(std::vector<RankPlace> places, std::vector<std::vector<int>> node_switch_hops = {},
           std::vector<std::string> overrides = {});

  int size() const noexcept { return static_cast<int>(places_.size()); }
  int num_nodes() const noexcept { return num_nodes_; }
  const RankPlace& place(int rank) const { return places_.at(rank); }
  std::span<const RankPlace> places() const noexcept { return places_; }
  int node_of(int rank) const { return places_.at(rank).node; }
  std::vector<int> ranks_on_node(int node) const;
  Distance distance(int a, int b) const { return classes_.at(static_cast<std::size_t>(a) * size() + b); }
  /// Relative cost of a message between a and b (model or measured), 0 for self.
  double cost(int a, int b) const { return costs_.at(static_cast<std::size_t>(a) * size() + b); }
  void set_cost(int a, int b, double c) { costs_.at(static_cast<std::size_t>(a) * size() + b) = c; }
  /// Every peer of `rank` except itself, nearest first; ties by distance class, then cost, then
  /// (peer - rank) mod n so that the order is deterministic and staggered.
  std::vector<int> peers_by_distance(int rank) const;
  /// Test overrides in force (HWLOC_XMLFILE, HWLOC_SYNTHETIC, UBEP_VIRTUAL_NODES, ...); empty = real.
  const std::vector<std::string>& overrides() const noexcept { return overrides_; }
  /// True when some rank is not bound to a subset of its host (classes inside a node are then `node`).
  bool any_unbound() const;

 private:
  std::vector<RankPlace> places_;
  std::vector<Distance> classes_;
  std::vector<double> costs_;
  std::vector<std::string> overrides_;
  int num_nodes_ = 0;
};

/// The all-to-all order for `rank`: every rank 0..n-1 exactly once, itself included (`topology` puts
/// self last, since it costs only a local copy; `linear` and `shifted` keep it at its natural position).
std::vector<int> schedule(const Topology& topo, int rank, ScheduleKind kind);

/// The report behind `ubep-info --topology`: per-rank placement (marked OVERRIDE where synthetic or
/// emulated), the distance-class matrix, each rank's schedule under `kind`, and advice for unbound ranks;
/// as text, or as one JSON document when `json` (Errc::unsupported in a build without nlohmann-json).
std::string describe_topology(const Topology& topo, ScheduleKind kind, bool json);

}  // namespace ubep
