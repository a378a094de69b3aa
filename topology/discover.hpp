// Discovery and exchange of rank placement (private to libubep). Contract used by runtime/context.cpp.
#pragma once

#include <mpi.h>

#include <span>
#include <string>
#include <vector>

#include "ubep/options.hpp"
#include "ubep/topology.hpp"

namespace ubep::detail {

/// Parses UBEP_VIRTUAL_NODES for `nranks` ranks: "N" = N nodes of consecutive rank blocks (sizes differ
/// by at most one), "0,1|2,3" = explicit rank lists per node (every rank exactly once). Returns the
/// emulated node of each rank; empty when `spec` is empty. Throws Errc::invalid_argument naming the spec.
std::vector<int> parse_virtual_nodes(const std::string& spec, int nranks);

/// Collective over `comm`: each rank discovers its own place (hwloc, host name), all ranks exchange
/// them (one allgather), and every rank returns the same Topology. `vnode_of_rank` (may be empty)
/// overrides the node of each rank (UBEP_VIRTUAL_NODES) and is reported as an override.
Topology gather_topology(MPI_Comm comm, const Options& options, std::span<const int> vnode_of_rank);

}  // namespace ubep::detail
