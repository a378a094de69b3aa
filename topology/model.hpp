// Pieces of the topology model shared by the Topology class, discovery and the tests (private).
#pragma once

#include <vector>

#include "ubep/topology.hpp"

namespace ubep::detail {

/// Model cost of one message at distance `d`: self 0, core 1, l3 2, numa 4, package 6, node 8,
/// switch 100, system 100 x hops (or one level beyond the farthest known pair when hops are unknown).
double model_cost(Distance d, int hops, int max_known_hops) noexcept;

/// Class of two ranks on the same node: `node` when either is unbound, else the finest level shared
/// on the way down from the package (levels unknown on either side are skipped; a known difference stops).
Distance classify_on_node(const RankPlace& a, const RankPlace& b) noexcept;

/// The class-`c` peers of `rank` in the order the `topology` schedule serves them (see schedule()).
std::vector<int> class_order(const Topology& topo, int rank, Distance c);

}  // namespace ubep::detail
