#include "topology/slurm.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "ubep/error.hpp"

namespace ubep::detail {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Splits on commas that are not inside brackets.
std::vector<std::string> split_top_level(std::string_view list) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  items.push_back(cur);
  return items;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list, std::size_t max_names) {
  if (list.empty()) throw std::invalid_argument("empty host list");
  // Two passes: check the whole list and count its names, then expand; so a list that names too many
  // hosts fails before anything is built (found by fuzz_slurm_topology).
  struct Range {
    std::string prefix, suffix;
    long lo, hi;
    std::size_t width;  // 0: a plain name (prefix)
  };
  std::vector<Range> parts;
  std::size_t count = 0;
  for (const std::string& item : split_top_level(list)) {
    if (item.empty()) throw std::invalid_argument("empty item in host list '" + std::string(list) + "'");
    auto open = item.find('[');
    auto close = item.find(']');
    if (open == std::string::npos && close == std::string::npos) {
      parts.push_back({item, "", 0, 0, 0});
      ++count;
      continue;
    }
    if (open == std::string::npos || close == std::string::npos || close < open)
      throw std::invalid_argument("unbalanced brackets in '" + item + "'");
    if (item.find('[', open + 1) != std::string::npos)
      throw std::invalid_argument("more than one bracket group in '" + item +
                                  "' (only one range group per name is supported)");
    std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
    std::string body = item.substr(open + 1, close - open - 1);
    if (body.empty()) throw std::invalid_argument("empty brackets in '" + item + "'");
    std::stringstream ranges(body);
    std::string range;
    while (std::getline(ranges, range, ',')) {
      auto dash = range.find('-');
      std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      if (!all_digits(lo) || !all_digits(hi))
        throw std::invalid_argument("bad range '" + range + "' in '" + item + "' (expected N or N-M)");
      if (lo.size() > 9 || hi.size() > 9) throw std::invalid_argument("range '" + range + "' is too large");
      long a = std::stol(lo), b = std::stol(hi);
      if (b < a) throw std::invalid_argument("descending range '" + range + "' in '" + item + "'");
      if (b - a > 100000) throw std::invalid_argument("range '" + range + "' is too large");
      parts.push_back({prefix, suffix, a, b, lo.size()});
      count += static_cast<std::size_t>(b - a + 1);
    }
  }
  if (count > max_names) {
    throw std::invalid_argument("host list '" + std::string(list.substr(0, 64)) + (list.size() > 64 ? "..." : "") +
                                "' names " + std::to_string(count) + " hosts, more than " + std::to_string(max_names));
  }
  std::vector<std::string> hosts;
  hosts.reserve(count);
  for (const Range& r : parts) {
    if (r.width == 0) {
      hosts.push_back(r.prefix);
      continue;
    }
    for (long v = r.lo; v <= r.hi; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < r.width) num.insert(0, r.width - num.size(), '0');
      hosts.push_back(r.prefix + num + r.suffix);
    }
  }
  return hosts;
}

std::string format_int_list(const std::vector<int>& values) {
  std::string out;
  for (std::size_t i = 0; i < values.size();) {
    std::size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(values[i]);
    if (j > i) out += '-' + std::to_string(values[j]);
    i = j + 1;
  }
  return out;
}

SwitchTree SwitchTree::parse(std::istream& in, const std::string& filename, std::size_t max_names) {
  auto fail = [&](int line, const std::string& why) -> Error {
    return Error(Errc::invalid_argument, "ubep: " + filename + ":" + std::to_string(line) + ": " + why);
  };
  SwitchTree tree;
  std::map<std::string, int> index;
  // Switches= may name switches defined further down, so links are resolved after reading.
  struct Pending {
    int parent;
    std::string child;
    int line;
  };
  std::vector<Pending> links;
  std::map<std::string, int> host_line;
  std::size_t names = 0;  // hosts and child switches named so far, at most max_names
  std::string text;
  for (int line_no = 1; std::getline(in, text); ++line_no) {
    if (auto hash = text.find('#'); hash != std::string::npos) text.erase(hash);
    std::stringstream words(text);
    std::string word;
    std::string name, nodes, children;
    bool has_name = false, has_nodes = false, has_children = false, any = false;
    while (words >> word) {
      any = true;
      auto eq = word.find('=');
      if (eq == std::string::npos) throw fail(line_no, "expected Key=Value, got '" + word + "'");
      std::string key = lower(word.substr(0, eq)), value = word.substr(eq + 1);
      if (value.empty()) throw fail(line_no, "empty value for " + word.substr(0, eq));
      if (key == "switchname") {
        name = value;
        has_name = true;
      } else if (key == "nodes") {
        nodes = value;
        has_nodes = true;
      } else if (key == "switches") {
        children = value;
        has_children = true;
      } else if (key == "linkspeed") {
        // Bandwidth hint; the distance classes only use the tree shape.
      } else {
        throw fail(line_no,
                   "unknown key '" + word.substr(0, eq) + "' (expected SwitchName, Switches, Nodes, LinkSpeed)");
      }
    }
    if (!any) continue;
    if (!has_name) throw fail(line_no, "line has no SwitchName=");
    if (index.count(name))
      throw fail(line_no,
                 "switch '" + name + "' already defined on line " + std::to_string(tree.switches_[index[name]].line));
    const int self = static_cast<int>(tree.switches_.size());
    index[name] = self;
    Switch sw;
    sw.name = name;
    sw.line = line_no;
    try {
      if (has_nodes) {
        sw.hosts = expand_hostlist(nodes, max_names - names);
        names += sw.hosts.size();
      }
      if (has_children) {
        for (const std::string& child : expand_hostlist(children, max_names - names)) {
          links.push_back({self, child, line_no});
          ++names;
        }
      }
    } catch (const std::invalid_argument& e) {
      throw fail(line_no, e.what());
    }
    for (const std::string& host : sw.hosts) {
      if (auto it = host_line.find(host); it != host_line.end())
        throw fail(line_no, "node '" + host + "' is already attached on line " + std::to_string(it->second));
      host_line[host] = line_no;
      tree.leaf_of_[host] = self;
    }
    tree.switches_.push_back(std::move(sw));
  }
  for (const Pending& link : links) {
    auto it = index.find(link.child);
    if (it == index.end()) throw fail(link.line, "unknown switch '" + link.child + "' in Switches=");
    Switch& child = tree.switches_[it->second];
    if (it->second == link.parent) throw fail(link.line, "switch '" + child.name + "' lists itself in Switches=");
    if (child.parent >= 0)
      throw fail(link.line,
                 "switch '" + child.name + "' already has parent '" + tree.switches_[child.parent].name + "'");
    child.parent = link.parent;
    tree.switches_[link.parent].children.push_back(it->second);
  }
  // A cycle means some switch reaches itself going up; each walk is bounded by the switch count.
  const int count = static_cast<int>(tree.switches_.size());
  for (int s = 0; s < count; ++s) {
    int cur = tree.switches_[s].parent;
    for (int steps = 0; cur >= 0; ++steps) {
      if (cur == s || steps > count)
        throw fail(tree.switches_[s].line, "switch '" + tree.switches_[s].name + "' is part of a cycle in Switches=");
      cur = tree.switches_[cur].parent;
    }
  }
  return tree;
}

SwitchTree SwitchTree::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::invalid_argument, "ubep: UBEP_TOPOLOGY_FILE=" + path + ": cannot open the file");
  return parse(in, path);
}

int SwitchTree::hops(const std::string& a, const std::string& b) const {
  if (a == b) return 0;
  auto ia = leaf_of_.find(a), ib = leaf_of_.find(b);
  if (ia == leaf_of_.end() || ib == leaf_of_.end()) return -1;
  // Levels climbed from each leaf to the lowest common ancestor; the farther side decides.
  std::vector<int> up_a;
  for (int s = ia->second; s >= 0; s = switches_[s].parent) up_a.push_back(s);
  int climbed_b = 0;
  for (int s = ib->second; s >= 0; s = switches_[s].parent, ++climbed_b) {
    auto pos = std::find(up_a.begin(), up_a.end(), s);
    if (pos != up_a.end()) return 1 + std::max(static_cast<int>(pos - up_a.begin()), climbed_b);
  }
  return -1;
}

}  // namespace ubep::detail
