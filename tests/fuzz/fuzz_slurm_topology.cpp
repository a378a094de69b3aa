// Fuzz target: the Slurm topology.conf parser (topology/slurm.cpp, SwitchTree::parse and expand_hostlist)
// and the host-level hop matrix built from its result (topology/local.cpp, node_hops).
// Property: parse returns a consistent tree or throws ubep::Error "ubep: <file>:<line>: <reason>"; nothing
// else escapes (std::invalid_argument from expand_hostlist included). On success: parent and child links
// agree, no switch reaches itself going up, every host hangs off exactly one switch, hops() is 0 on the
// diagonal, symmetric, 1 exactly for hosts of one leaf, -1 for unknown hosts, and node_hops() equals hops().
#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "fuzz_common.hpp"
#include "topology/local.hpp"
#include "topology/slurm.hpp"

namespace {

using ubep::detail::SwitchTree;

void check_tree(const SwitchTree& tree) {
  const auto& sw = tree.switches();
  const int count = static_cast<int>(sw.size());
  // Hash sets, not trees: the fuzzer's comparison tracing makes ordered string maps of 10^5 long names slow.
  std::unordered_set<std::string> names, hosts;
  std::vector<std::string> sample;
  for (int s = 0; s < count; ++s) {
    UBEP_FUZZ_CHECK(names.insert(sw[s].name).second, "switch defined twice: " + sw[s].name);
    UBEP_FUZZ_CHECK(sw[s].parent >= -1 && sw[s].parent < count, "parent out of range");
    if (sw[s].parent >= 0) {
      const auto& siblings = sw[sw[s].parent].children;
      UBEP_FUZZ_CHECK(std::count(siblings.begin(), siblings.end(), s) == 1, "parent does not list its child once");
    }
    for (int c : sw[s].children) {
      UBEP_FUZZ_CHECK(c >= 0 && c < count && sw[c].parent == s, "child does not name its parent");
    }
    int steps = 0;
    for (int cur = sw[s].parent; cur >= 0; cur = sw[cur].parent) {
      UBEP_FUZZ_CHECK(cur != s && ++steps <= count, "cycle through switch " + sw[s].name);
    }
    for (const std::string& h : sw[s].hosts) {
      UBEP_FUZZ_CHECK(!h.empty(), "empty host name");
      UBEP_FUZZ_CHECK(hosts.insert(h).second, "host on two switches: " + h);
      if (sample.size() < 24) {
        UBEP_FUZZ_CHECK(tree.has_host(h), "host not indexed: " + h);
        sample.push_back(h);
      }
    }
  }
  // hops() on a sample of hosts (the matrix is quadratic), plus one host that is not in the file.
  std::string unknown = "not-a-host";
  while (hosts.count(unknown)) unknown += '_';
  sample.push_back(unknown);
  std::unordered_map<std::string, int> leaf;  // the switch of each sampled host
  for (int s = 0; s < count && leaf.size() + 1 < sample.size(); ++s)
    for (const std::string& h : sw[s].hosts)
      if (std::find(sample.begin(), sample.end(), h) != sample.end()) leaf[h] = s;
  auto leaf_of = [&](const std::string& h) {
    const auto it = leaf.find(h);
    return it == leaf.end() ? -1 : it->second;
  };
  const int n = static_cast<int>(sample.size());
  std::vector<ubep::RankPlace> places(n);
  for (int i = 0; i < n; ++i) {
    places[i].rank = i;
    places[i].node = i;
    places[i].host = sample[i];
  }
  const auto matrix = ubep::detail::node_hops(tree, places);
  UBEP_FUZZ_CHECK(static_cast<int>(matrix.size()) == n, "node_hops: wrong size");
  for (int a = 0; a < n; ++a) {
    UBEP_FUZZ_CHECK(tree.hops(sample[a], sample[a]) == 0, "hops(a, a) != 0 for " + sample[a]);
    for (int b = 0; b < n; ++b) {
      const int h = tree.hops(sample[a], sample[b]);
      const std::string pair = sample[a] + " / " + sample[b] + " = " + std::to_string(h);
      UBEP_FUZZ_CHECK(h == tree.hops(sample[b], sample[a]), "hops not symmetric: " + pair);
      UBEP_FUZZ_CHECK(matrix[a][b] == (a == b ? 0 : h), "node_hops differs from hops: " + pair);
      if (a == b) continue;
      const int la = leaf_of(sample[a]), lb = leaf_of(sample[b]);
      if (la < 0 || lb < 0) {
        UBEP_FUZZ_CHECK(h == -1, "unknown host has hops: " + pair);
      } else {
        UBEP_FUZZ_CHECK(h == -1 || h >= 1, "hops below 1 between two hosts: " + pair);
        UBEP_FUZZ_CHECK((h == 1) == (la == lb), "hops 1 iff same leaf switch: " + pair);
        UBEP_FUZZ_CHECK(h <= count, "more levels than switches: " + pair);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The host-list expander alone, on the first line: a list, or std::invalid_argument with the reason (also
  // for more than 4096 names: the cap, cheaply).
  const std::string first = text.substr(0, text.find('\n'));
  try {
    const auto hosts = ubep::detail::expand_hostlist(first, 4096);
    UBEP_FUZZ_CHECK(hosts.size() <= 4096, "the cap on names does not hold");
    for (const std::string& h : hosts) UBEP_FUZZ_CHECK(!h.empty(), "empty host");
  } catch (const std::invalid_argument&) {
  }
  std::istringstream in(text);
  try {
    // A cap of 4096 names instead of kMaxTopologyNames: the same code path, and inputs near the cap stay
    // fast under the sanitizers (600k long names took over 10 s).
    check_tree(SwitchTree::parse(in, "fuzz.conf", 4096));
  } catch (const ubep::Error& e) {
    UBEP_FUZZ_CHECK(e.code() == ubep::Errc::invalid_argument, e.what());
    ubep::fuzz::check_message(e, "fuzz.conf:");
  }
  return 0;
}
