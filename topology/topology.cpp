// Topology: classes and costs from gathered places, peer ranking and all-to-all schedules. Pure code,
// no MPI: everything here is exercised by the unit tests.
#include "ubep/topology.hpp"

#include <algorithm>
#include <array>
#include <numeric>

#include "topology/model.hpp"
#include "ubep/error.hpp"

namespace ubep {

const char* to_string(Distance d) noexcept {
  switch (d) {
    case Distance::self: return "self";
    case Distance::core: return "core";
    case Distance::l3: return "l3";
    case Distance::numa: return "numa";
    case Distance::package: return "package";
    case Distance::node: return "node";
    case Distance::switch_: return "switch";
    case Distance::system: return "system";
  }
  return "?";
}

namespace detail {

double model_cost(Distance d, int hops, int max_known_hops) noexcept {
  switch (d) {
    case Distance::self: return 0.0;
    case Distance::core: return 1.0;
    case Distance::l3: return 2.0;
    case Distance::numa: return 4.0;
    case Distance::package: return 6.0;
    case Distance::node: return 8.0;
    case Distance::switch_: return 100.0;
    case Distance::system:
      // Unknown placement costs one level more than the farthest known pair, so it is never cheaper.
      return 100.0 * (hops > 1 ? hops : std::max(2, max_known_hops + 1));
  }
  return 0.0;
}

Distance classify_on_node(const RankPlace& a, const RankPlace& b) noexcept {
  // An unbound rank may run anywhere on its host: only "same host" is known.
  if (!a.bound || !b.bound) return Distance::node;
  // Coarse to fine, stopping at the first level known on both sides that differs: a NUMA node that
  // spans both packages (one-NUMA machines) must not make ranks on different packages look close.
  struct Level {
    int x, y;
    Distance d;
  };
  const Level levels[] = {{a.package, b.package, Distance::package},
                          {a.numa, b.numa, Distance::numa},
                          {a.l3, b.l3, Distance::l3},
                          {a.core, b.core, Distance::core},
                          {a.pu, b.pu, Distance::core}};
  Distance d = Distance::node;
  for (const Level& l : levels) {
    if (l.x < 0 || l.y < 0) continue;
    if (l.x != l.y) break;
    d = l.d;
  }
  return d;
}

}  // namespace detail

Topology::Topology(std::vector<RankPlace> places, std::vector<std::vector<int>> node_switch_hops,
                   std::vector<std::string> overrides)
    : places_(std::move(places)), overrides_(std::move(overrides)) {
  const int n = size();
  for (int r = 0; r < n; ++r) {
    if (places_[r].rank != r)
      throw Error(Errc::internal,
                  "ubep: Topology: place " + std::to_string(r) + " has rank " + std::to_string(places_[r].rank));
    if (places_[r].node < 0 || places_[r].node >= n)
      throw Error(Errc::internal,
                  "ubep: Topology: rank " + std::to_string(r) + " has node " + std::to_string(places_[r].node));
    num_nodes_ = std::max(num_nodes_, places_[r].node + 1);
  }
  auto hops = [&](int na, int nb) {
    if (na == nb) return 0;
    if (static_cast<std::size_t>(na) >= node_switch_hops.size()) return -1;
    const auto& row = node_switch_hops[na];
    return static_cast<std::size_t>(nb) < row.size() ? row[nb] : -1;
  };
  int max_known = 1;
  for (const auto& row : node_switch_hops)
    for (int h : row) max_known = std::max(max_known, h);

  classes_.assign(static_cast<std::size_t>(n) * n, Distance::self);
  costs_.assign(static_cast<std::size_t>(n) * n, 0.0);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      const RankPlace &pa = places_[a], &pb = places_[b];
      Distance d = Distance::self;
      int h = 0;
      if (a != b && pa.node == pb.node) {
        d = detail::classify_on_node(pa, pb);
      } else if (a != b) {
        h = hops(pa.node, pb.node);
        d = h == 1 ? Distance::switch_ : Distance::system;
      }
      classes_[static_cast<std::size_t>(a) * n + b] = d;
      costs_[static_cast<std::size_t>(a) * n + b] = detail::model_cost(d, h, max_known);
    }
  }
}

std::vector<int> Topology::ranks_on_node(int node) const {
  std::vector<int> out;
  for (const RankPlace& p : places_)
    if (p.node == node) out.push_back(p.rank);
  return out;
}

bool Topology::any_unbound() const {
  return std::any_of(places_.begin(), places_.end(), [](const RankPlace& p) { return !p.bound; });
}

std::vector<int> Topology::peers_by_distance(int rank) const {
  const int n = size();
  if (rank < 0 || rank >= n)
    throw Error(Errc::out_of_range,
                "ubep: peers_by_distance: rank " + std::to_string(rank) + " outside [0, " + std::to_string(n) + ")");
  std::vector<int> peers;
  for (int p = 0; p < n; ++p)
    if (p != rank) peers.push_back(p);
  std::stable_sort(peers.begin(), peers.end(), [&](int x, int y) {
    if (distance(rank, x) != distance(rank, y)) return distance(rank, x) < distance(rank, y);
    if (cost(rank, x) != cost(rank, y)) return cost(rank, x) < cost(rank, y);
    return (x - rank + n) % n < (y - rank + n) % n;
  });
  return peers;
}

namespace detail {

std::vector<int> class_order(const Topology& topo, int rank, Distance c) {
  const int n = topo.size();
  // The cluster of `rank` at level c: everyone at distance <= c. When the classes form an ultrametric
  // (they do when they come from nested hardware levels and switch trees), the cluster splits into parts
  // (clusters at the level below) and class-c peers are exactly the members of the other parts: a
  // complete multipartite graph, scheduled below.
  std::vector<int> cluster;
  for (int y = 0; y < n; ++y)
    if (topo.distance(rank, y) <= c) cluster.push_back(y);
  // Parts by representative (the first member): ultrametric classes make "closer than c to the
  // representative" an equivalence.
  std::vector<int> part_of(n, -1);
  std::vector<std::vector<int>> parts;
  for (int z : cluster) {
    for (std::size_t j = 0; j < parts.size() && part_of[z] < 0; ++j)
      if (topo.distance(parts[j].front(), z) < c) part_of[z] = static_cast<int>(j);
    if (part_of[z] < 0) {
      part_of[z] = static_cast<int>(parts.size());
      parts.emplace_back();
    }
    parts[part_of[z]].push_back(z);
  }
  const int own = part_of[rank];
  const int local = static_cast<int>(std::find(parts[own].begin(), parts[own].end(), rank) - parts[own].begin());
  // Targets outside the own part, parts in cyclic order starting after it. Sender with local index l
  // takes out[(l + s) mod |out|] at step s. Two senders of one part differ in l, so they never collide
  // while the part is no larger than |out|; with equal part sizes, senders of different parts never
  // collide either (see docs/TOPOLOGY.md and the exhaustive test in topology_schedule_test.cpp).
  std::vector<int> out;
  const int q = static_cast<int>(parts.size());
  for (int t = 1; t < q; ++t) {
    const auto& part = parts[(own + t) % q];
    out.insert(out.end(), part.begin(), part.end());
  }
  std::vector<int> order;
  std::vector<char> taken(n, 0);
  const int m = static_cast<int>(out.size());
  for (int s = 0; s < m; ++s) {
    const int p = out[(local + s) % m];
    if (topo.distance(rank, p) == c && !taken[p]) {
      order.push_back(p);
      taken[p] = 1;
    }
  }
  // Only a non-ultrametric class matrix (odd overlapping bindings) can leave peers out: append them in
  // shifted order so that every peer still appears exactly once.
  for (int i = 1; i < n; ++i) {
    const int p = (rank + i) % n;
    if (topo.distance(rank, p) == c && !taken[p]) order.push_back(p);
  }
  return order;
}

}  // namespace detail

std::vector<int> schedule(const Topology& topo, int rank, ScheduleKind kind) {
  const int n = topo.size();
  if (rank < 0 || rank >= n)
    throw Error(Errc::out_of_range,
                "ubep: schedule: rank " + std::to_string(rank) + " outside [0, " + std::to_string(n) + ")");
  std::vector<int> order;
  order.reserve(n);
  switch (kind) {
    case ScheduleKind::linear:
      for (int i = 0; i < n; ++i) order.push_back(i);
      break;
    case ScheduleKind::shifted:
      for (int i = 0; i < n; ++i) order.push_back((rank + i) % n);
      break;
    case ScheduleKind::topology: {
      std::array<bool, 8> present{};
      for (int p = 0; p < n; ++p) present[static_cast<int>(topo.distance(rank, p))] = true;
      for (int c = static_cast<int>(Distance::system); c > static_cast<int>(Distance::self); --c) {
        if (!present[c]) continue;
        auto part = detail::class_order(topo, rank, static_cast<Distance>(c));
        order.insert(order.end(), part.begin(), part.end());
      }
      order.push_back(rank);
      break;
    }
  }
  return order;
}

}  // namespace ubep
