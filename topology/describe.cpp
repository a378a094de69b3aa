// describe_topology: the text and JSON reports behind `ubep-info --topology`.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "topology/discover.hpp"
#include "topology/slurm.hpp"
#include "ubep/error.hpp"

#ifndef UBEP_NO_JSON
#include <nlohmann/json.hpp>
#endif

namespace ubep {

using detail::format_int_list;

namespace {

const char* short_code(Distance d) {
  switch (d) {
    case Distance::self: return "S";
    case Distance::core: return "C";
    case Distance::l3: return "L3";
    case Distance::numa: return "N";
    case Distance::package: return "P";
    case Distance::node: return "Nd";
    case Distance::switch_: return "Sw";
    case Distance::system: return "Sy";
  }
  return "?";
}

std::string index_or_dash(int v) { return v < 0 ? "-" : std::to_string(v); }

std::vector<int> unbound_ranks(const Topology& topo) {
  std::vector<int> out;
  for (const RankPlace& p : topo.places())
    if (!p.bound) out.push_back(p.rank);
  return out;
}

constexpr const char* kBindAdvice =
    "run with mpirun --bind-to core (Open MPI) or -bind-to core (MPICH) to get package/NUMA/core classes";

std::string describe_json(const Topology& topo, ScheduleKind kind) {
#ifdef UBEP_NO_JSON
  throw Error(Errc::unsupported, "ubep: describe_topology: this build has no nlohmann-json, so no --json output");
#else
  using nlohmann::json;
  const int n = topo.size();
  json j;
  j["size"] = n;
  j["num_nodes"] = topo.num_nodes();
  j["schedule"] = to_string(kind);
  json ranks = json::array();
  for (const RankPlace& p : topo.places()) {
    ranks.push_back({{"rank", p.rank},
                     {"host", p.host},
                     {"node", p.node},
                     {"bound", p.bound},
                     {"cpuset", p.cpuset},
                     {"package", p.package},
                     {"numa", p.numa},
                     {"l3", p.l3},
                     {"core", p.core},
                     {"pu", p.pu},
                     {"gpu", p.gpu},
                     {"nic", p.nic}});
  }
  j["ranks"] = ranks;
  json classes = json::array(), costs = json::array();
  json schedules = json::object();
  for (int a = 0; a < n; ++a) {
    json crow = json::array(), krow = json::array();
    for (int b = 0; b < n; ++b) {
      crow.push_back(to_string(topo.distance(a, b)));
      krow.push_back(topo.cost(a, b));
    }
    classes.push_back(crow);
    costs.push_back(krow);
    schedules[std::to_string(a)] = schedule(topo, a, kind);
  }
  j["classes"] = classes;
  j["costs"] = costs;
  j["schedules"] = schedules;
  j["overrides"] = topo.overrides();
  j["unbound"] = unbound_ranks(topo);
  if (topo.any_unbound()) j["advice"] = kBindAdvice;
  // Names and info strings come from hwloc (an XML file may hold any bytes): invalid UTF-8 is replaced
  // (U+FFFD), not thrown.
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
#endif
}

}  // namespace

std::string describe_topology(const Topology& topo, ScheduleKind kind, bool json) {
  if (json) return describe_json(topo, kind);
  const int n = topo.size();
  std::ostringstream out;
  out << "topology: " << n << " rank" << (n == 1 ? "" : "s") << " on " << topo.num_nodes() << " node"
      << (topo.num_nodes() == 1 ? "" : "s") << ", schedule " << to_string(kind) << "\n";
  for (const std::string& o : topo.overrides())
    out << (o.find("UBEP_VIRTUAL_NODES") == 0 ? "OVERRIDE (emulated): " : "OVERRIDE: ") << o << "\n";

  std::size_t host_w = 4, cpus_w = 6, nic_w = 3;
  for (const RankPlace& p : topo.places()) {
    host_w = std::max(host_w, p.host.size());
    cpus_w = std::max(cpus_w, p.cpuset.size());
    nic_w = std::max(nic_w, p.nic.size());
  }
  char line[512];
  std::snprintf(line, sizeof line, "%5s %-*s %4s %4s %4s %4s %4s %4s %-*s %4s %-*s\n", "rank", static_cast<int>(host_w),
                "host", "node", "pkg", "numa", "l3", "core", "pu", static_cast<int>(cpus_w), "cpuset", "gpu",
                static_cast<int>(nic_w), "nic");
  out << line;
  for (const RankPlace& p : topo.places()) {
    std::snprintf(line, sizeof line, "%5d %-*s %4d %4s %4s %4s %4s %4s %-*s %4s %-*s\n", p.rank,
                  static_cast<int>(host_w), p.host.c_str(), p.node, index_or_dash(p.package).c_str(),
                  index_or_dash(p.numa).c_str(), index_or_dash(p.l3).c_str(), index_or_dash(p.core).c_str(),
                  index_or_dash(p.pu).c_str(), static_cast<int>(cpus_w), p.bound ? p.cpuset.c_str() : "unbound",
                  index_or_dash(p.gpu).c_str(), static_cast<int>(nic_w), p.nic.empty() ? "-" : p.nic.c_str());
    out << line;
  }

  out << "distance classes (S self, C core, L3 shared L3, N numa, P package, Nd node, Sw switch, Sy system):\n";
  const int w = std::max(3, static_cast<int>(std::to_string(n - 1).size()) + 1);
  out << std::string(6, ' ');
  for (int b = 0; b < n; ++b) out << std::string(w - std::to_string(b).size(), ' ') << b;
  out << "\n";
  for (int a = 0; a < n; ++a) {
    std::snprintf(line, sizeof line, "%5d ", a);
    out << line;
    for (int b = 0; b < n; ++b) {
      const std::string code = short_code(topo.distance(a, b));
      out << std::string(w - code.size(), ' ') << code;
    }
    out << "\n";
  }

  out << "schedules (" << to_string(kind) << "; '|' separates distance classes):\n";
  for (int a = 0; a < n; ++a) {
    std::snprintf(line, sizeof line, "%5d:", a);
    out << line;
    const auto order = schedule(topo, a, kind);
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (kind == ScheduleKind::topology && i > 0 && topo.distance(a, order[i]) != topo.distance(a, order[i - 1]))
        out << " |";
      out << ' ' << order[i];
    }
    out << "\n";
  }
  const auto unbound = unbound_ranks(topo);
  if (!unbound.empty()) {
    out << "UNBOUND: rank" << (unbound.size() == 1 ? " " : "s ") << format_int_list(unbound)
        << (unbound.size() == 1 ? " is" : " are")
        << " not bound to a core, so ranks on one node are only known to share the node (class Nd); " << kBindAdvice
        << "\n";
  }
  return out.str();
}

}  // namespace ubep
