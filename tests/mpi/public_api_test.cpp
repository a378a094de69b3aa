// The public queries and helpers that replaced internal access (issue 11): Context::info() (what
// ubep-info prints), ubep::throw_mpi_error / check_mpi, describe_topology, and the split headers, each
// usable on its own. Registered under the default route, the forced mpi route and emulated nodes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

// Each split header compiles alone (its own includes suffice); ubep.hpp includes them all.
#include "ubep/signal.hpp"
#include "ubep/symmetric.hpp"
// (the order above is deliberate: no header may rely on another being included first)
#include "tests/mpi/test_util.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

bool forced_mpi(const Context& ctx) {
  return ctx.options().transports.size() == 1 && ctx.options().transports[0] == "mpi";
}

TEST(PublicApi, InfoMatchesTheRouteTable) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(8u << 20));
  const RuntimeInfo info = ctx.info();
  ASSERT_EQ(info.routes.size(), static_cast<std::size_t>(ctx.size()));
  std::set<std::string> used;
  for (int pe = 0; pe < ctx.size(); ++pe) {
    EXPECT_EQ(info.routes[pe], ctx.route(pe)) << "pe " << pe;
    used.insert(to_string(info.routes[pe]));
  }
  if (ctx.atomics_through_mpi()) used.insert("mpi");
  if (used.count("ucx")) EXPECT_FALSE(ctx.atomics_through_mpi()) << "atomics take the ucx route with it";
  // The transports in use: exactly the routes taken plus MPI for atomics, cheapest first, no repeats.
  const std::vector<std::string> order{"self", "shm", "ucx", "mpi"};
  std::vector<std::string> expected;
  for (const auto& t : order)
    if (used.count(t)) expected.push_back(t);
  EXPECT_EQ(info.transports, expected);
  if (forced_mpi(ctx)) EXPECT_EQ(info.transports, std::vector<std::string>{"mpi"});
  if (ctx.options().transports == std::vector<std::string>{"ucx"}) {
    EXPECT_EQ(info.transports, std::vector<std::string>{"ucx"});
  }

  const std::set<std::string> models{"MPI_WIN_UNIFIED", "MPI_WIN_SEPARATE", "unknown", "none"};
  EXPECT_TRUE(models.count(info.node_window_model)) << info.node_window_model;
  EXPECT_TRUE(models.count(info.world_window_model)) << info.world_window_model;
  // The heap lives in the node window, so it always exists; the world window exactly when MPI is used.
  EXPECT_NE(info.node_window_model, "none");
  EXPECT_EQ(info.world_window_model == "none", !used.count("mpi")) << info.world_window_model;
  EXPECT_TRUE(test::all_ranks(!HasFailure()));
  ctx.finalize();
  test::expect_error(Errc::finalized, [&] { (void)ctx.info(); }, {"info", "finalized"});
}

TEST(PublicApi, MpiErrorHelperNamesRankCallAndMpiText) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  ASSERT_EQ(MPI_Error_string(MPI_ERR_RANK, text, &len), MPI_SUCCESS);
  const std::string mpi_text(text, len);
  const std::string prefix = "ubep: rank " + std::to_string(rank) + ": my_step: MPI_Send failed: ";
  try {
    throw_mpi_error(MPI_ERR_RANK, rank, "my_step", "MPI_Send");
    ADD_FAILURE() << "throw_mpi_error returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::mpi);
    EXPECT_EQ(e.native(), MPI_ERR_RANK);
    EXPECT_EQ(std::string(e.what()), prefix + mpi_text);
  }
  EXPECT_NO_THROW(check_mpi(MPI_SUCCESS, rank, "my_step", "MPI_Send"));
  test::expect_error(Errc::mpi, [&] { check_mpi(MPI_ERR_COUNT, rank, "my_step", "MPI_Recv"); },
                     {"ubep: rank " + std::to_string(rank) + ": my_step: MPI_Recv failed: "});
  // A real failed call on a communicator with MPI_ERRORS_RETURN, as a user would check it.
  MPI_Comm comm = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
  ASSERT_EQ(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), MPI_SUCCESS);
  int size = 0;
  MPI_Comm_size(comm, &size);
  char byte = 0;
  const int rc = MPI_Send(&byte, 1, MPI_CHAR, size + 5, 0, comm);  // no such rank
  test::expect_error(Errc::mpi, [&] { check_mpi(rc, rank, "bad_send", "MPI_Send"); }, {"bad_send", "MPI_Send failed"});
  MPI_Comm_free(&comm);
}

TEST(PublicApi, DescribeTopologyIsPublic) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(8u << 20));
  const std::string text = describe_topology(ctx.topology(), ScheduleKind::topology, false);
  EXPECT_NE(text.find("topology: " + std::to_string(ctx.size()) + " rank"), std::string::npos) << text;
  EXPECT_NE(text.find("schedule topology"), std::string::npos) << text;
  if (!ctx.options().virtual_nodes.empty()) EXPECT_NE(text.find("OVERRIDE (emulated)"), std::string::npos) << text;
  ctx.finalize();
}

TEST(PublicApi, SignalVocabularyStandsAlone) {
  // compare() is constexpr and total over Cmp.
  static_assert(compare(5, Cmp::ge, 5) && !compare(4, Cmp::ge, 5) && compare(4, Cmp::lt, 5) && compare(5, Cmp::eq, 5));
  EXPECT_TRUE(compare(6, Cmp::gt, 5));
  EXPECT_TRUE(compare(5, Cmp::le, 5));
  EXPECT_TRUE(compare(4, Cmp::ne, 5));
  EXPECT_STREQ(to_string(SignalOp::add), "add");
  EXPECT_STREQ(to_string(Route::shm), "shm");
  WaitOptions w;
  EXPECT_FALSE(w.timeout.has_value());
  EXPECT_TRUE(w.writers.empty());
  Symmetric<int> empty;  // a default handle owns nothing; free() on it does nothing
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_NO_THROW(empty.free());
}

}  // namespace
}  // namespace ubep
