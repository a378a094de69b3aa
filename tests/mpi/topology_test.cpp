// gather_topology across ranks: every rank ends with the same Topology; virtual nodes, the Slurm file,
// binding and the probe behave as documented.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "topology/discover.hpp"
#include "ubep/error.hpp"

namespace {

const std::filesystem::path kFixtures = std::filesystem::path(__FILE__).parent_path().parent_path() / "fixtures";

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) { return (h ^ v) * 1099511628211ull; }

// A digest of everything a Topology holds, so one allgather checks that all ranks agree.
std::uint64_t digest(const ubep::Topology& topo) {
  std::uint64_t h = 1469598103934665603ull;
  h = mix(h, static_cast<std::uint64_t>(topo.size()));
  h = mix(h, static_cast<std::uint64_t>(topo.num_nodes()));
  for (int a = 0; a < topo.size(); ++a) {
    const auto& p = topo.place(a);
    h = mix(h, std::hash<std::string>{}(p.host + "|" + p.cpuset + "|" + p.nic));
    for (int v : {p.node, static_cast<int>(p.bound), p.package, p.numa, p.l3, p.core, p.pu, p.gpu})
      h = mix(h, static_cast<std::uint64_t>(v + 1));
    for (int b = 0; b < topo.size(); ++b) {
      h = mix(h, static_cast<std::uint64_t>(topo.distance(a, b)));
      h = mix(h, static_cast<std::uint64_t>(topo.cost(a, b) * 1000.0));
    }
  }
  return h;
}

void expect_same_on_all_ranks(const ubep::Topology& topo) {
  const std::uint64_t mine = digest(topo);
  std::vector<std::uint64_t> all(world_size());
  ASSERT_EQ(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), MPI_SUCCESS);
  for (int r = 0; r < world_size(); ++r) EXPECT_EQ(all[r], mine) << "rank " << r << " has another topology";
}

TEST(TopologyMpi, GatheredTopologyAgreesOnEveryRank) {
  ubep::Options opts;
  auto topo = ubep::detail::gather_topology(MPI_COMM_WORLD, opts, {});
  ASSERT_EQ(topo.size(), world_size());
  EXPECT_EQ(topo.num_nodes(), 1);  // one real host
  EXPECT_EQ(topo.place(world_rank()).rank, world_rank());
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  EXPECT_EQ(topo.place(world_rank()).host, std::string(name, len));
  EXPECT_TRUE(topo.overrides().empty() || std::getenv("HWLOC_XMLFILE") || std::getenv("HWLOC_SYNTHETIC"));
  for (int a = 0; a < topo.size(); ++a)
    for (int b = 0; b < topo.size(); ++b) EXPECT_LE(topo.distance(a, b), ubep::Distance::node);
  expect_same_on_all_ranks(topo);
}

// Each rank binds itself to one PU (round robin) before discovery: all ranks are bound, ranks on the
// same PU are `core` apart, and nobody is reported unbound.
TEST(TopologyMpi, BoundRanksGetHardwareClasses) {
  cpu_set_t old_set;
  ASSERT_EQ(sched_getaffinity(0, sizeof old_set, &old_set), 0);
  // Open MPI binds each rank to a core for np <= 2: bind from the online CPUs, not the current mask.
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs at least two CPUs";
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(world_rank() % 2, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  ubep::Topology topo;
  try {
    topo = ubep::detail::gather_topology(MPI_COMM_WORLD, ubep::Options{}, {});
  } catch (...) {
    sched_setaffinity(0, sizeof old_set, &old_set);
    throw;
  }
  sched_setaffinity(0, sizeof old_set, &old_set);
  EXPECT_FALSE(topo.any_unbound());
  for (int a = 0; a < topo.size(); ++a) {
    EXPECT_EQ(topo.place(a).cpuset, std::to_string(a % 2));
    for (int b = 0; b < topo.size(); ++b) {
      if (a == b) continue;
      if (a % 2 == b % 2)
        EXPECT_EQ(topo.distance(a, b), ubep::Distance::core) << a << " " << b;
      else
        EXPECT_GT(topo.distance(a, b), ubep::Distance::core) << a << " " << b;
    }
  }
  expect_same_on_all_ranks(topo);
}

TEST(TopologyMpi, VirtualNodesSplitAsAsked) {
  const int n = world_size();
  ubep::Options opts;
  opts.virtual_nodes = "2";
  auto vnodes = ubep::detail::parse_virtual_nodes(opts.virtual_nodes, n);
  auto topo = ubep::detail::gather_topology(MPI_COMM_WORLD, opts, vnodes);
  ASSERT_EQ(topo.num_nodes(), 2);
  // Consecutive blocks, the first one taking the odd rank.
  const int first = (n + 1) / 2;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(topo.node_of(r), r < first ? 0 : 1);
    EXPECT_EQ(topo.place(r).host, r < first ? "vnode0" : "vnode1");
  }
  EXPECT_EQ(static_cast<int>(topo.ranks_on_node(0).size()), first);
  EXPECT_EQ(topo.distance(0, n - 1), ubep::Distance::system);
  ASSERT_EQ(topo.overrides().size(), 1u);
  EXPECT_EQ(topo.overrides()[0], "UBEP_VIRTUAL_NODES=2 (emulated nodes)");
  expect_same_on_all_ranks(topo);

  // An explicit map: even ranks on one node, odd ranks on the other.
  std::string spec;
  for (int parity : {0, 1}) {
    if (parity) spec += '|';
    for (int r = parity, k = 0; r < n; r += 2, ++k) spec += (k ? "," : "") + std::to_string(r);
  }
  auto explicit_map = ubep::detail::parse_virtual_nodes(spec, n);
  auto topo2 = ubep::detail::gather_topology(MPI_COMM_WORLD, ubep::Options{}, explicit_map);
  for (int r = 0; r < n; ++r) EXPECT_EQ(topo2.node_of(r), r % 2);
  EXPECT_EQ(topo2.distance(0, 1), ubep::Distance::system);
  if (n > 2) EXPECT_EQ(topo2.distance(0, 2), ubep::Distance::node);  // unbound on one (emulated) node
  expect_same_on_all_ranks(topo2);
  const std::string text = ubep::describe_topology(topo2, ubep::ScheduleKind::topology, false);
  EXPECT_NE(text.find("OVERRIDE (emulated): UBEP_VIRTUAL_NODES=" + spec), std::string::npos) << text;
}

// One emulated node per rank, vnode0/vnode1 on one leaf switch and vnode2/vnode3 on another.
TEST(TopologyMpi, SwitchFileGivesSwitchAndSystemClasses) {
  const int n = world_size();
  ubep::Options opts;
  opts.topology_file = (kFixtures / "vnodes_two_switches.conf").string();
  std::vector<int> own_node(n);
  for (int r = 0; r < n; ++r) own_node[r] = r;
  auto topo = ubep::detail::gather_topology(MPI_COMM_WORLD, opts, own_node);
  EXPECT_EQ(topo.num_nodes(), n);
  EXPECT_EQ(topo.distance(0, 1), ubep::Distance::switch_);
  if (n > 2) {
    EXPECT_EQ(topo.distance(0, 2), ubep::Distance::system);
    EXPECT_EQ(topo.distance(1, 2), ubep::Distance::system);
    EXPECT_LT(topo.cost(0, 1), topo.cost(0, 2));
  }
  if (n > 3) EXPECT_EQ(topo.distance(2, 3), ubep::Distance::switch_);
  expect_same_on_all_ranks(topo);
}

TEST(TopologyMpi, BadSwitchFileFailsOnEveryRankWithTheLine) {
  ubep::Options opts;
  opts.topology_file = (kFixtures / "bad_topology.conf").string();
  try {
    ubep::detail::gather_topology(MPI_COMM_WORLD, opts, {});
    ADD_FAILURE() << "no error";
  } catch (const ubep::Error& e) {
    EXPECT_EQ(e.code(), ubep::Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("bad_topology.conf:4: unknown switch 's3'"), std::string::npos) << e.what();
  }
  // Still in step: a collective after the failure completes.
  EXPECT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
}

// The probe replaces every model cost by a measured one-way latency in microseconds. What only a
// measurement passes: every pair's cost differs from the model's for the same classes (a measured
// double that equals the model's small integers exactly does not happen), it is finite, positive,
// the same both ways and on every rank, and it is not longer than the probe call itself took (its
// ping-pongs run inside it). Nothing about the order of classes: these "nodes" are virtual, one host.
TEST(TopologyMpi, ProbeFillsMeasuredCostsEverywhere) {
  ubep::Options opts;
  const int n = world_size();
  std::vector<int> vnodes = ubep::detail::parse_virtual_nodes("2", n);
  const auto model = ubep::detail::gather_topology(MPI_COMM_WORLD, opts, vnodes);
  opts.topology_probe = true;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  auto topo = ubep::detail::gather_topology(MPI_COMM_WORLD, opts, vnodes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double slowest = seconds;
  ASSERT_EQ(MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), MPI_SUCCESS);
  EXPECT_LT(seconds, 5.0);  // meant to be well under a second; generous for an oversubscribed machine
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const double c = topo.cost(a, b);
      EXPECT_EQ(topo.distance(a, b), model.distance(a, b)) << a << " " << b << ": the probe changes costs only";
      if (a == b) {
        EXPECT_EQ(c, 0.0);
        continue;
      }
      const std::string pair = std::to_string(a) + "-" + std::to_string(b) + " (" +
                               ubep::to_string(topo.distance(a, b)) + "): cost " + std::to_string(c);
      EXPECT_TRUE(std::isfinite(c) && c > 0.0) << pair;
      EXPECT_NE(c, model.cost(a, b)) << pair << " is the model's, not measured";
      EXPECT_EQ(c, topo.cost(b, a)) << pair << " differs from " << b << "-" << a;
      EXPECT_LE(c, slowest * 1e6) << pair << " us is longer than the whole probe (" << slowest << " s)";
    }
  expect_same_on_all_ranks(topo);
  if (world_rank() == 0) {
    std::printf("probe took %.3f s; measured one-way latency (us) from rank 0:", seconds);
    for (int b = 1; b < n; ++b) std::printf(" %d:%.2f", b, topo.cost(0, b));
    std::printf("\n");
  }
}

TEST(TopologyMpi, WrongMapSizeIsRejected) {
  std::vector<int> too_short(1, 0);
  if (world_size() == 1) GTEST_SKIP();
  EXPECT_THROW(ubep::detail::gather_topology(MPI_COMM_WORLD, ubep::Options{}, too_short), ubep::Error);
}

}  // namespace
