// Fuzz target: the UBEP_VIRTUAL_NODES parser (topology/discover.cpp, parse_virtual_nodes, and the rank
// lists of topology/local.cpp, parse_cpu_list).
// Input: two bytes of rank count (1..4096, and now and then 0 or negative), then the spec.
// Property: the parser returns a map or throws ubep::Error(invalid_argument) naming "UBEP_VIRTUAL_NODES=<spec>";
// on success the map is a partition of the ranks: one node per rank, node ids 0..K-1 with none empty, in
// order of their rank lists; "N" gives N blocks of consecutive ranks whose sizes differ by at most one; and
// the map written back as rank lists ("0-1|2,3", as gather_topology reports it) parses to the same map.
#include <algorithm>
#include <cstring>
#include <map>

#include "fuzz_common.hpp"
#include "topology/discover.hpp"
#include "topology/slurm.hpp"

namespace {

std::string spec_of(const std::vector<int>& node) {
  std::map<int, std::vector<int>> members;
  for (std::size_t r = 0; r < node.size(); ++r) members[node[r]].push_back(static_cast<int>(r));
  std::string spec;
  for (const auto& [k, ranks] : members) {
    if (!spec.empty()) spec += '|';
    spec += ubep::detail::format_int_list(ranks);
  }
  return spec;
}

void check_map(const std::string& spec, int nranks, const std::vector<int>& node) {
  if (spec.empty()) {
    UBEP_FUZZ_CHECK(node.empty(), "empty spec gave a map");
    return;
  }
  UBEP_FUZZ_CHECK(static_cast<int>(node.size()) == nranks, "map size " + std::to_string(node.size()));
  const int k = *std::max_element(node.begin(), node.end()) + 1;
  std::vector<int> size(k, 0);
  for (int v : node) {
    UBEP_FUZZ_CHECK(v >= 0 && v < k, "node id out of range");
    ++size[v];
  }
  for (int v = 0; v < k; ++v) UBEP_FUZZ_CHECK(size[v] > 0, "node " + std::to_string(v) + " is empty");
  if (spec.find_first_not_of("0123456789") == std::string::npos) {
    UBEP_FUZZ_CHECK(std::is_sorted(node.begin(), node.end()), "node count spec: blocks not consecutive");
    const auto [lo, hi] = std::minmax_element(size.begin(), size.end());
    UBEP_FUZZ_CHECK(*hi - *lo <= 1, "node count spec: block sizes differ by more than one");
    UBEP_FUZZ_CHECK(std::to_string(k) == spec.substr(std::min(spec.find_first_not_of('0'), spec.size() - 1)),
                    "node count spec: " + std::to_string(k) + " nodes");
  }
  // Round trip through the rank-list form; explicit lists number nodes in the order they are written,
  // which is the order of their smallest rank only when written so: compare as partitions.
  // One node of one rank writes as "0", which reads as a node count: the spec syntax has no other form.
  const std::string again = nranks == 1 ? "1" : spec_of(node);
  std::vector<int> back;
  try {
    back = ubep::detail::parse_virtual_nodes(again, nranks);
  } catch (const ubep::Error& e) {
    UBEP_FUZZ_CHECK(false, "the map written back does not parse: " + spec + " -> " + again + ": " + e.what());
  }
  UBEP_FUZZ_CHECK(back.size() == node.size(), "round trip size: " + again);
  std::map<int, int> rename;
  for (std::size_t r = 0; r < node.size(); ++r) {
    auto [it, fresh] = rename.emplace(node[r], back[r]);
    UBEP_FUZZ_CHECK(it->second == back[r], "round trip changed the partition: " + spec + " -> " + again);
    (void)fresh;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ubep::fuzz::Bytes in(data, size);
  const std::uint16_t raw = in.u16();
  // Mostly small rank counts (the interesting splits), sometimes large, 0 and negative.
  int nranks = (raw & 0x8000) ? (raw & 0x0fff) + 1 : (raw & 0x3f) + 1;
  if (raw == 0xffff) nranks = 0;
  if (raw == 0xfffe) nranks = -3;
  // The spec comes from the environment: a C string.
  std::string spec = in.rest();
  spec.resize(std::strlen(spec.c_str()));
  try {
    check_map(spec, nranks, ubep::detail::parse_virtual_nodes(spec, nranks));
  } catch (const ubep::Error& e) {
    UBEP_FUZZ_CHECK(e.code() == ubep::Errc::invalid_argument, e.what());
    ubep::fuzz::check_message(e, "UBEP_VIRTUAL_NODES=" + spec);
  }
  return 0;
}
