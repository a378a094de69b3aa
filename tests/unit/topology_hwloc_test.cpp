// Places, classes, costs, rankings and schedules from hwloc fixtures (tests/fixtures, see its README).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "topology/discover.hpp"
#include "topology/local.hpp"
#include "ubep/config.hpp"
#include "ubep/error.hpp"

namespace {

using ubep::Distance;
using ubep::ScheduleKind;
using ubep::detail::HostLayout;
using ubep::detail::PlaceRecord;

const std::filesystem::path kFixtures = std::filesystem::path(__FILE__).parent_path().parent_path() / "fixtures";

std::string fixture(const char* name) { return (kFixtures / name).string(); }

std::string read_line(const char* name) {
  std::ifstream in(fixture(name));
  std::string line;
  std::getline(in, line);
  return line;
}

PlaceRecord on_host(PlaceRecord rec, const std::string& host) {
  ubep::detail::copy_fixed(rec.host, sizeof rec.host, host);
  rec.host_key = ubep::detail::hash_name(host);
  return rec;
}

// One record per rank: `cpus[r]` empty = unbound.
std::vector<PlaceRecord> records_for(const HostLayout& layout, const std::vector<std::vector<int>>& cpus,
                                     const std::string& host = "h0") {
  std::vector<PlaceRecord> recs;
  const auto all = ubep::detail::parse_cpu_list(layout.all_pus());
  for (const auto& set : cpus) recs.push_back(on_host(layout.place_of(set.empty() ? all : set, !set.empty()), host));
  return recs;
}

#if UBEP_HAVE_HWLOC

// 2 packages x 2 NUMA nodes x 2 L3 x 2 cores x 2 PUs; NUMALatency 10 local, 12 same package, 21 remote.
TEST(TopologyHwloc, TwoSocketNumaServerClasses) {
  auto layout = HostLayout::from_xml(fixture("two_socket_numa.xml"));
  EXPECT_TRUE(layout.overridden());
  EXPECT_EQ(layout.all_pus(), "0-31");
  auto recs = records_for(layout, {{0}, {1}, {2}, {4}, {8}, {16}, {}, {0, 1, 2, 3}});
  EXPECT_EQ(recs[0].package, 0);
  EXPECT_EQ(recs[0].numa, 0);
  EXPECT_EQ(recs[0].l3, 0);
  EXPECT_EQ(recs[0].core, 0);
  EXPECT_EQ(recs[0].pu, 0);
  EXPECT_EQ(recs[5].package, 1);
  EXPECT_EQ(recs[5].numa, 2);
  EXPECT_EQ(recs[6].bound, 0);
  EXPECT_EQ(recs[6].numa, -1);
  EXPECT_EQ(recs[7].core, -1);  // spans two cores of one L3
  EXPECT_EQ(recs[7].l3, 0);
  EXPECT_STREQ(recs[7].cpuset, "0-3");
  ASSERT_EQ(recs[0].num_numa, 4);
  EXPECT_EQ(recs[0].numa_latency[1], 12u);
  EXPECT_EQ(recs[0].numa_latency[2], 21u);

  auto topo = ubep::detail::build_topology(recs, {});
  EXPECT_EQ(topo.num_nodes(), 1);
  EXPECT_EQ(topo.distance(0, 1), Distance::core);
  EXPECT_EQ(topo.distance(0, 2), Distance::l3);
  EXPECT_EQ(topo.distance(0, 3), Distance::numa);
  EXPECT_EQ(topo.distance(0, 4), Distance::package);
  EXPECT_EQ(topo.distance(0, 5), Distance::node);
  EXPECT_EQ(topo.distance(0, 6), Distance::node);  // unbound: only the node is known
  EXPECT_EQ(topo.distance(0, 7), Distance::l3);
  EXPECT_EQ(topo.distance(2, 7), Distance::l3);
  EXPECT_TRUE(topo.any_unbound());
  // NUMALatency refines the model: package 6 x 12/10, node 8 x 21/10; the unbound rank keeps the model.
  EXPECT_DOUBLE_EQ(topo.cost(0, 3), 4.0);
  EXPECT_DOUBLE_EQ(topo.cost(0, 4), 6.0 * 1.2);
  EXPECT_DOUBLE_EQ(topo.cost(0, 5), 8.0 * 2.1);
  EXPECT_DOUBLE_EQ(topo.cost(0, 6), 8.0);
  EXPECT_EQ(topo.peers_by_distance(0), (std::vector<int>{1, 2, 7, 3, 4, 6, 5}));
  EXPECT_EQ(ubep::schedule(topo, 0, ScheduleKind::topology).back(), 0);
}

// One rank per core on both sockets, two nodes: the schedule is perfectly staggered at every class.
TEST(TopologyHwloc, TwoSocketNumaServerScheduleOnTwoNodes) {
  auto layout = HostLayout::from_xml(fixture("two_socket_numa.xml"));
  std::vector<std::vector<int>> cores;
  for (int c = 0; c < 16; ++c) cores.push_back({2 * c, 2 * c + 1});
  auto recs = records_for(layout, cores, "a");
  auto second = records_for(layout, cores, "b");
  recs.insert(recs.end(), second.begin(), second.end());
  auto topo = ubep::detail::build_topology(recs, {});
  ASSERT_EQ(topo.size(), 32);
  EXPECT_EQ(topo.num_nodes(), 2);
  EXPECT_EQ(topo.distance(0, 16), Distance::system);
  // rank 0: 16 remote ranks, then the other package (8), the other NUMA node's ranks (4)...
  auto order = ubep::schedule(topo, 0, ScheduleKind::topology);
  std::vector<Distance> classes;
  for (int p : order) classes.push_back(topo.distance(0, p));
  EXPECT_EQ(std::count(classes.begin(), classes.begin() + 16, Distance::system), 16);
  EXPECT_EQ(std::count(classes.begin() + 16, classes.begin() + 24, Distance::node), 8);
  EXPECT_EQ(std::count(classes.begin() + 24, classes.begin() + 28, Distance::package), 4);
  EXPECT_EQ(std::count(classes.begin() + 28, classes.begin() + 30, Distance::numa), 2);
  EXPECT_EQ(classes[30], Distance::l3);
  EXPECT_EQ(order[31], 0);
  // No peer is the target of two senders at any step of any class.
  for (int c = 0; c < 8; ++c) {
    std::vector<std::vector<int>> per_rank(32);
    for (int r = 0; r < 32; ++r)
      for (int p : ubep::schedule(topo, r, ScheduleKind::topology))
        if (static_cast<int>(topo.distance(r, p)) == c && p != r) per_rank[r].push_back(p);
    for (int s = 0; s < 32; ++s) {
      std::vector<int> hits(32, 0);
      for (int r = 0; r < 32; ++r)
        if (s < static_cast<int>(per_rank[r].size())) EXPECT_EQ(++hits[per_rank[r][s]], 1) << "class " << c;
    }
  }
}

// 2 packages x 4 cores, 8 GPUs and 4 NICs: two PCIe switches per package, each with 2 GPUs and 1 NIC.
TEST(TopologyHwloc, GpuNodeNearestGpuAndNic) {
  auto layout = HostLayout::from_xml(fixture("gpu_node.xml"));
  EXPECT_EQ(layout.num_gpus(), 8);
  auto recs = records_for(layout, {{0}, {1}, {2}, {3}, {4}, {7}, {}, {0, 1, 2, 3}});
  const int gpus[] = {0, 1, 2, 3, 4, 7};
  const char* nics[] = {"mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_3"};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(recs[r].gpu, gpus[r]) << "rank " << r;
    EXPECT_STREQ(recs[r].nic, nics[r]) << "rank " << r;
  }
  EXPECT_EQ(recs[6].gpu, -1);  // unbound across both packages: no GPU is nearer than another
  EXPECT_STREQ(recs[6].nic, "");
  EXPECT_EQ(recs[7].gpu, 0);  // bound to package 0 as a whole: its first GPU
  auto topo = ubep::detail::build_topology(recs, {});
  EXPECT_EQ(topo.place(2).gpu, 2);
  EXPECT_EQ(topo.place(2).nic, "mlx5_1");
  EXPECT_EQ(topo.distance(0, 1), Distance::l3);
  EXPECT_EQ(topo.distance(0, 4), Distance::node);
}

// A synthetic many-core layout (256 PUs); 64 ranks, one per pair of cores.
TEST(TopologyHwloc, ManyCoreSyntheticRankingAndSchedule) {
  auto layout = HostLayout::from_synthetic(read_line("many_core.synthetic"));
  EXPECT_EQ(layout.all_pus(), "0-255");
  std::vector<std::vector<int>> sets;
  for (int r = 0; r < 64; ++r) sets.push_back({4 * r, 4 * r + 1});
  auto topo = ubep::detail::build_topology(records_for(layout, sets), {});
  EXPECT_EQ(topo.distance(0, 3), Distance::l3);
  EXPECT_EQ(topo.distance(0, 4), Distance::numa);
  EXPECT_EQ(topo.distance(0, 31), Distance::package);
  EXPECT_EQ(topo.distance(0, 32), Distance::node);
  auto peers = topo.peers_by_distance(5);
  EXPECT_EQ(std::vector<int>(peers.begin(), peers.begin() + 3), (std::vector<int>{6, 7, 4}));
  for (int i = 0; i < 63; ++i)
    if (i > 0) EXPECT_LE(topo.distance(5, peers[i - 1]), topo.distance(5, peers[i]));
  // Perfect stagger in every class.
  for (int c = 1; c < 8; ++c) {
    std::vector<std::vector<int>> per_rank(64);
    for (int r = 0; r < 64; ++r)
      for (int p : ubep::schedule(topo, r, ScheduleKind::topology))
        if (static_cast<int>(topo.distance(r, p)) == c) per_rank[r].push_back(p);
    for (int s = 0; s < 64; ++s) {
      std::vector<int> hits(64, 0);
      for (int r = 0; r < 64; ++r)
        if (s < static_cast<int>(per_rank[r].size())) ASSERT_EQ(++hits[per_rank[r][s]], 1) << "class " << c;
    }
  }
}

TEST(TopologyHwloc, EnvironmentOverrideIsNoticed) {
  setenv("HWLOC_SYNTHETIC", "pack:2 core:2 pu:1", 1);
  auto layout = HostLayout::load_this_host();
  unsetenv("HWLOC_SYNTHETIC");
  EXPECT_TRUE(layout.overridden());
  EXPECT_EQ(layout.all_pus(), "0-3");
  auto real = HostLayout::load_this_host();
  EXPECT_FALSE(real.overridden());
}

// One NUMA node over two packages: sharing it does not make ranks on different packages close.
TEST(TopologyHwloc, NumaNodeSpanningPackagesDoesNotHideThePackage) {
  auto layout = HostLayout::from_synthetic("pack:2 core:2 pu:1");
  auto topo = ubep::detail::build_topology(records_for(layout, {{0}, {1}, {2}}), {});
  EXPECT_EQ(topo.place(2).numa, 0);
  EXPECT_EQ(topo.distance(0, 1), Distance::numa);
  EXPECT_EQ(topo.distance(0, 2), Distance::node);
}

TEST(TopologyHwloc, BadFixturesThrow) {
  EXPECT_THROW(HostLayout::from_xml("/nonexistent.xml"), ubep::Error);
  EXPECT_THROW(HostLayout::from_synthetic("pack:two"), ubep::Error);
}

#endif  // UBEP_HAVE_HWLOC

TEST(TopologyHwloc, DescribeTextAndJson) {
  std::vector<ubep::RankPlace> places(3);
  for (int r = 0; r < 3; ++r) {
    places[r].rank = r;
    places[r].node = r / 2;
    places[r].host = "vnode" + std::to_string(r / 2);
  }
  places[0].bound = places[1].bound = true;
  places[0].core = 0;
  places[1].core = 0;
  places[0].cpuset = places[1].cpuset = "0";
  ubep::Topology topo(places, {}, {"UBEP_VIRTUAL_NODES=2 (emulated nodes)", "HWLOC_SYNTHETIC=pack:2"});
  const std::string text = ubep::describe_topology(topo, ScheduleKind::topology, false);
  EXPECT_NE(text.find("OVERRIDE (emulated): UBEP_VIRTUAL_NODES=2"), std::string::npos) << text;
  EXPECT_NE(text.find("OVERRIDE: HWLOC_SYNTHETIC=pack:2"), std::string::npos) << text;
  EXPECT_NE(text.find("UNBOUND: rank 2 is not bound"), std::string::npos) << text;
  EXPECT_NE(text.find("--bind-to core"), std::string::npos) << text;
  EXPECT_NE(text.find("    0: 2 | 1 | 0"), std::string::npos) << text;
#ifndef UBEP_NO_JSON
  const std::string json = ubep::describe_topology(topo, ScheduleKind::shifted, true);
  for (const char* key : {"\"ranks\"", "\"classes\"", "\"costs\"", "\"schedules\"", "\"overrides\"", "\"unbound\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << "\n" << json;
  EXPECT_NE(json.find("\"core\""), std::string::npos);
#endif
}

TEST(TopologyHwloc, VirtualNodeSpecs) {
  using ubep::detail::parse_virtual_nodes;
  EXPECT_TRUE(parse_virtual_nodes("", 4).empty());
  EXPECT_EQ(parse_virtual_nodes("2", 4), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(parse_virtual_nodes("2", 5), (std::vector<int>{0, 0, 0, 1, 1}));
  EXPECT_EQ(parse_virtual_nodes("3", 7), (std::vector<int>{0, 0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(parse_virtual_nodes("0,2|1,3", 4), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(parse_virtual_nodes("0-2|3", 4), (std::vector<int>{0, 0, 0, 1}));
  for (const char* bad : {"0", "5", "0,1|1,2,3", "0,1", "0,1|", "|0,1,2,3", "0,1|2,x", "0,1|2,3,4"}) {
    try {
      parse_virtual_nodes(bad, 4);
      ADD_FAILURE() << bad;
    } catch (const ubep::Error& e) {
      EXPECT_EQ(e.code(), ubep::Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::string("UBEP_VIRTUAL_NODES=") + bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
