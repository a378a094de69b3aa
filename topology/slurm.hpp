// Slurm topology.conf parsing (private to libubep): which leaf switch each host hangs off, and how many
// switch levels separate two hosts.
#pragma once

#include <cstddef>
#include <istream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ubep::detail {

/// The most host and switch names one topology file may hold, all lines together: a 2 KiB file of ranges
/// such as "n[0-99999,0-99999,...]" would otherwise name 30 million hosts and stall every rank (found by
/// fuzz_slurm_topology). Slurm clusters have well under 2^18 nodes.
inline constexpr std::size_t kMaxTopologyNames = std::size_t{1} << 18;

/// Expands a Slurm host list: "node[01-04,07]", "a1,b[2-3]", "login". One bracket group per item
/// (Slurm's multi-dimensional "rack[1-2]node[1-4]" is not supported); zero padding follows the width
/// of the range's first bound. Throws std::invalid_argument with the reason on a malformed list, and when
/// the list names more than `max_names` hosts (counted before anything is expanded).
std::vector<std::string> expand_hostlist(std::string_view list, std::size_t max_names = kMaxTopologyNames);

/// Compresses sorted integers into a range list ("0-3,7"); used for rank and cpu lists.
std::string format_int_list(const std::vector<int>& values);

/// The switch tree of a topology.conf.
class SwitchTree {
 public:
  struct Switch {
    std::string name;
    std::vector<int> children;       ///< child switches (indices into switches())
    std::vector<std::string> hosts;  ///< hosts attached directly
    int parent = -1;
    int line = 0;  ///< where it was defined, for messages
  };

  /// Parses `in`; `filename` only names the file in errors. Throws ubep::Error (invalid_argument)
  /// "<filename>:<line>: <reason>" for unknown keys, a line without SwitchName, a bad host range, a
  /// switch defined twice, an unknown switch in Switches=, a switch with two parents, a host on two
  /// switches, cycles, and more than `max_names` host and switch names in all (see kMaxTopologyNames).
  static SwitchTree parse(std::istream& in, const std::string& filename, std::size_t max_names = kMaxTopologyNames);
  /// Reads and parses a file; throws ubep::Error when it cannot be read or parsed.
  static SwitchTree load(const std::string& path);

  const std::vector<Switch>& switches() const noexcept { return switches_; }
  bool has_host(const std::string& host) const { return leaf_of_.count(host) != 0; }
  /// Switch levels between two hosts: 0 = same host, 1 = same leaf switch, k = the lowest common
  /// ancestor is k-1 levels above the farther host's leaf; -1 when either host is not in the file or the
  /// two hang off disjoint trees.
  int hops(const std::string& a, const std::string& b) const;

 private:
  std::vector<Switch> switches_;
  std::map<std::string, int> leaf_of_;
};

}  // namespace ubep::detail
