// Run by CTest through emulate.sh only (label multinode): the ranks really sit on distinct emulated hosts
// (network namespaces with their own hostnames), and ubep must see that by itself, with no
// UBEP_VIRTUAL_NODES override: one node per host, shm inside a node, mpi between nodes, `node` class for
// unbound ranks of one host, and with the topology file emulate.sh writes for --switches 2, `switch`
// class under one leaf switch and `system` across the spine.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "topology/discover.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

TEST(EmulatedNodes, TopologyAndRoutesSeeRealHosts) {
  const int nodes = env_int("UBEP_EMULATED_NODES");
  if (nodes < 2) GTEST_SKIP() << "not started by tests/multinode/emulate.sh (UBEP_EMULATED_NODES unset)";
  const int switches = env_int("UBEP_TEST_SWITCHES");  // as passed to emulate.sh --switches (0: none)
  Options opts = Options::from_env();
  ASSERT_TRUE(opts.virtual_nodes.empty()) << "this test is about real hosts: unset UBEP_VIRTUAL_NODES";
  Context ctx(MPI_COMM_WORLD, opts);
  const Topology& topo = ctx.topology();
  const int n = ctx.size(), per_node = n / nodes;
  ASSERT_EQ(n % nodes, 0);
  EXPECT_EQ(topo.num_nodes(), nodes);
  EXPECT_TRUE(topo.overrides().empty()) << "nothing may be emulated inside ubep here";
  const auto node = [&](int r) { return r / per_node; };              // emulate.sh places ranks in blocks
  const auto sw = [&](int r) { return node(r) * switches / nodes; };  // and nodes in contiguous switches
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      SCOPED_TRACE("ranks " + std::to_string(a) + " and " + std::to_string(b));
      EXPECT_EQ(topo.place(a).host == topo.place(b).host, node(a) == node(b));
      Distance want = Distance::self;
      if (a != b && node(a) == node(b)) want = Distance::node;  // unbound (--bind-to none) on one host
      if (node(a) != node(b)) want = switches >= 2 && sw(a) == sw(b) ? Distance::switch_ : Distance::system;
      EXPECT_EQ(topo.distance(a, b), want);
    }
    // Off the node: the first of ucx, mpi that the options name (ucx in builds with UCX, by default).
    const auto& t = ctx.options().transports;
    const Route off = std::find(t.begin(), t.end(), "ucx") != t.end() && UBEP_HAVE_UCX ? Route::ucx : Route::mpi;
    const Route want = a == ctx.rank() ? Route::self : node(a) == node(ctx.rank()) ? Route::shm : off;
    EXPECT_EQ(ctx.route(a), want) << "route to rank " << a;
  }
  // What `ubep-info --topology` prints from the same Topology.
  const std::string text = describe_topology(topo, ScheduleKind::topology, false);
  EXPECT_NE(text.find(std::to_string(n) + " ranks on " + std::to_string(nodes) + " nodes"), std::string::npos) << text;
  if (per_node > 1) EXPECT_NE(text.find(" Nd"), std::string::npos) << text;
  EXPECT_NE(text.find(switches >= 2 ? " Sw" : " Sy"), std::string::npos) << text;
  if (switches >= 2 && nodes > switches) EXPECT_NE(text.find(" Sy"), std::string::npos) << text;
  ctx.finalize();
}

}  // namespace
}  // namespace ubep
