// Slurm topology.conf parsing: host ranges, switch trees, hop counts and errors with line numbers.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "topology/local.hpp"
#include "topology/slurm.hpp"
#include "ubep/error.hpp"

namespace {

using ubep::detail::expand_hostlist;
using ubep::detail::SwitchTree;

const std::filesystem::path kFixtures = std::filesystem::path(__FILE__).parent_path().parent_path() / "fixtures";

SwitchTree parse(const std::string& text) {
  std::istringstream in(text);
  return SwitchTree::parse(in, "test.conf");
}

// Expects a parse error whose message names test.conf:<line> and contains `reason`.
void expect_error(const std::string& text, int line, const std::string& reason) {
  try {
    parse(text);
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const ubep::Error& e) {
    EXPECT_EQ(e.code(), ubep::Errc::invalid_argument);
    const std::string what = e.what();
    EXPECT_NE(what.find("test.conf:" + std::to_string(line) + ":"), std::string::npos) << what;
    EXPECT_NE(what.find(reason), std::string::npos) << what;
  }
}

TEST(TopologySlurm, HostLists) {
  EXPECT_EQ(expand_hostlist("node[01-04,07]"),
            (std::vector<std::string>{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_hostlist("a,b[8-10],c"), (std::vector<std::string>{"a", "b8", "b9", "b10", "c"}));
  EXPECT_EQ(expand_hostlist("r[9-10]x"), (std::vector<std::string>{"r9x", "r10x"}));
  EXPECT_EQ(expand_hostlist("n[007-008]"), (std::vector<std::string>{"n007", "n008"}));
  EXPECT_THROW(expand_hostlist("node[4-1]"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node[1-x]"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("node[1-2"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("rack[1-2]n[1-2]"), std::invalid_argument);
  EXPECT_THROW(expand_hostlist("a,,b"), std::invalid_argument);
}

TEST(TopologySlurm, TwoSwitchesOfFourNodes) {
  auto tree = SwitchTree::load((kFixtures / "two_switches.conf").string());
  EXPECT_EQ(tree.switches().size(), 3u);
  EXPECT_EQ(tree.hops("node01", "node01"), 0);
  EXPECT_EQ(tree.hops("node01", "node04"), 1);
  EXPECT_EQ(tree.hops("node01", "node05"), 2);
  EXPECT_EQ(tree.hops("node08", "node02"), 2);
  EXPECT_EQ(tree.hops("node01", "node09"), -1);
  EXPECT_TRUE(tree.has_host("node07"));
  EXPECT_FALSE(tree.has_host("node7"));
}

TEST(TopologySlurm, ThreeLevelTree) {
  auto tree = SwitchTree::load((kFixtures / "three_level.conf").string());
  EXPECT_EQ(tree.switches().size(), 7u);
  EXPECT_EQ(tree.hops("n01", "n02"), 1);  // same leaf
  EXPECT_EQ(tree.hops("n01", "n03"), 2);  // leaf1, leaf2 under agg1
  EXPECT_EQ(tree.hops("n01", "n08"), 3);  // through the core
  EXPECT_EQ(tree.hops("n07", "n05"), 2);
}

TEST(TopologySlurm, HopMatrixAndClassesForNodes) {
  // Three hosts: two on leaf1, one on leaf2, one unknown.
  auto tree = SwitchTree::load((kFixtures / "two_switches.conf").string());
  std::vector<ubep::RankPlace> places(4);
  const char* hosts[] = {"node01", "node02", "node05", "elsewhere"};
  for (int r = 0; r < 4; ++r) {
    places[r].rank = r;
    places[r].node = r;
    places[r].host = hosts[r];
  }
  auto hops = ubep::detail::node_hops(tree, places);
  EXPECT_EQ(hops[0][1], 1);
  EXPECT_EQ(hops[0][2], 2);
  EXPECT_EQ(hops[0][3], -1);
  ubep::Topology topo(places, hops);
  EXPECT_EQ(topo.distance(0, 1), ubep::Distance::switch_);
  EXPECT_EQ(topo.distance(0, 2), ubep::Distance::system);
  EXPECT_EQ(topo.distance(0, 3), ubep::Distance::system);
  // Unknown placement is never cheaper than the farthest known one.
  EXPECT_LT(topo.cost(0, 1), topo.cost(0, 2));
  EXPECT_LT(topo.cost(0, 2), topo.cost(0, 3));
}

TEST(TopologySlurm, ErrorsNameTheLine) {
  expect_error("SwitchName=s1 Nodes=a[1-2]\nSwitchName=s2 Nodez=b1\n", 2, "unknown key 'Nodez'");
  expect_error("# comment\n\nNodes=a1\n", 3, "no SwitchName");
  expect_error("SwitchName=s1 Nodes=a[3-1]\n", 1, "descending range");
  expect_error("SwitchName=s1 Nodes=a[1-2\n", 1, "unbalanced");
  expect_error("SwitchName=s1 Nodes=a1\nSwitchName=top Switches=s1,s9\n", 2, "unknown switch 's9'");
  expect_error("SwitchName=s1 Nodes=a1\nSwitchName=s1 Nodes=a2\n", 2, "already defined on line 1");
  expect_error("SwitchName=s1 Nodes=a1\nSwitchName=s2 Nodes=a[0-1]\n", 2, "'a1' is already attached on line 1");
  expect_error("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", 1, "cycle");
  expect_error("SwitchName=a Switches=a\n", 1, "itself");
  expect_error("SwitchName=s1 Nodes=a1 junk\n", 1, "expected Key=Value");
  expect_error("SwitchName=s1 Nodes=\n", 1, "empty value");
  expect_error("SwitchName=x Switches=s1\nSwitchName=y Switches=s1\nSwitchName=s1 Nodes=a\n", 2, "already has parent");
}

TEST(TopologySlurm, MissingFile) {
  try {
    SwitchTree::load("/nonexistent/topology.conf");
    FAIL();
  } catch (const ubep::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/topology.conf"), std::string::npos);
  }
}

}  // namespace
