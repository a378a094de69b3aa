// This host's layout (hwloc) and the compact per-rank record exchanged by gather_topology (private).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ubep/topology.hpp"

namespace ubep::detail {

inline constexpr int kMaxNumaLatency = 32;

/// What one rank sends to all others: fixed size, so one MPI_Allgather of bytes moves it.
struct PlaceRecord {
  char host[64];           ///< host name (or "vnodeK"), truncated, NUL-terminated
  std::uint64_t host_key;  ///< FNV-1a of the full host name, so truncated names still differ
  std::int32_t bound;      ///< 1 when bound to a strict subset of the host's PUs
  std::int32_t package, numa, l3, core, pu, gpu;
  std::int32_t num_numa;                        ///< entries used in numa_latency (0: hwloc gave no NUMALatency)
  std::uint32_t numa_latency[kMaxNumaLatency];  ///< NUMALatency from this rank's NUMA node to node j
  char cpuset[96];                              ///< bound cpuset list ("0-3"), truncated with "..." when longer
  char nic[32];                                 ///< nearest network device name
  char error[160];  ///< non-empty when discovery failed on this rank (reported collectively)
};
static_assert(std::is_trivially_copyable_v<PlaceRecord>);

/// FNV-1a, for host keys.
std::uint64_t hash_name(const std::string& s) noexcept;
/// Copies `s` into a fixed char array, truncating (with "..." when `ellipsis`).
void copy_fixed(char* dst, std::size_t cap, const std::string& s, bool ellipsis = false);

/// Parses a cpu list ("0-3,8"): comma-separated items N or N-M (N <= M) of decimal digits only, empty items
/// skipped; returns the values sorted, without duplicates. Throws std::out_of_range, whose what() is the
/// value, for the first value above `max_value` (before expanding anything, so "0-2000000000" costs
/// nothing), and std::invalid_argument naming the item for anything else.
std::vector<int> parse_cpu_list(const std::string& list, int max_value = std::numeric_limits<int>::max());

/// The hardware layout of one host, loaded once. Move-only; owns the hwloc topology when built with hwloc.
class HostLayout {
 public:
  /// This host as hwloc sees it, I/O devices included. hwloc itself honours HWLOC_XMLFILE and
  /// HWLOC_SYNTHETIC; overridden() says whether one was set. Without hwloc: an empty layout.
  static HostLayout load_this_host();
  /// A layout from an XML file or a synthetic description (tests, fixtures). Throws ubep::Error.
  static HostLayout from_xml(const std::string& path);
  static HostLayout from_synthetic(const std::string& description);

  HostLayout();
  HostLayout(HostLayout&&) noexcept;
  HostLayout& operator=(HostLayout&&) noexcept;
  ~HostLayout();

  /// True when the layout does not describe the machine we run on (XML or synthetic).
  bool overridden() const noexcept { return overridden_; }
  /// All PUs of the layout (OS indices), as a list string; empty without hwloc.
  std::string all_pus() const;
  /// Record of a process whose affinity is `cpus` (OS indices). `bound` false records the place as
  /// unknown (indices -1) and still looks for a GPU/NIC local to the whole set.
  PlaceRecord place_of(const std::vector<int>& cpus, bool bound) const;
  /// Number of NVIDIA GPUs found (CUDA devices, or PCI 3D/VGA controllers of vendor 0x10de).
  int num_gpus() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  bool overridden_ = false;
};

/// Places and topology from gathered records (rank order): node ids by first appearance of the host,
/// the model costs refined by NUMALatency for bound ranks on the same node. `hops` is the
/// node-level hop matrix from a Slurm file (empty: no switch information).
Topology build_topology(const std::vector<PlaceRecord>& records, const std::vector<std::vector<int>>& hops,
                        std::vector<std::string> overrides = {});

/// Places (node ids filled) from records, in rank order.
std::vector<RankPlace> places_from_records(const std::vector<PlaceRecord>& records);

/// Host-level hop matrix (num_nodes^2) for the hosts of `places` from a Slurm switch tree.
class SwitchTree;
std::vector<std::vector<int>> node_hops(const SwitchTree& tree, const std::vector<RankPlace>& places);

}  // namespace ubep::detail
