// Issue 10, item 2: a wait on the mpi route must time out when a peer stalls (alive, not calling MPI).
// CTest runs this with UCX_TLS=tcp,self on the forced mpi route: UCX's RMA over TCP is a software
// protocol that completes only when the target progresses, as between real nodes without RDMA, so an
// MPI_Win_flush to a stalled peer blocks inside MPI. Rank 1 stalls; every other rank must get
// Errc::timeout naming rank 1 within its deadline, long before rank 1 wakes up.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "tests/mpi/test_util.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

constexpr double kTimeout = 1.0;  // the survivors' UBEP_WAIT_TIMEOUT
constexpr int kStallSeconds = 8;  // how long rank 1 stays away from MPI

TEST(Issue10, StalledPeerOnMpiRouteTimesOut) {
  Options o = Options::from_env();
  o.heap_size = 16 << 20;
  o.wait_timeout = std::chrono::duration<double>(kTimeout);
  Context ctx(MPI_COMM_WORLD, o);
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks";
  const int me = ctx.rank(), stalled = 1;
  ASSERT_TRUE(test::all_ranks(me == stalled || ctx.route(stalled) == Route::mpi))
      << "rank 1 must be reached through MPI: run across nodes or with UBEP_TRANSPORTS=mpi";
  auto buf = ctx.alloc<std::uint8_t>(1 << 20);
  auto sig = ctx.alloc_signals(ctx.size());
  auto reply = ctx.alloc_signals(1);
  ctx.barrier();
  std::vector<std::uint8_t> src(1 << 20, static_cast<std::uint8_t>(me));
  if (me == stalled) {
    std::this_thread::sleep_for(std::chrono::seconds(kStallSeconds));  // no MPI call at all
    for (int pe = 0; pe < ctx.size(); ++pe) {
      if (pe != stalled) ctx.signal_op(reply.data(), 1, SignalOp::set, pe);
    }
    ctx.quiet();
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    bool timed_out = false;
    try {
      // Data, then a signal: delivering the signal needs a flush of the data to the stalled rank.
      ctx.put_signal_nbi(buf.data(), src.data(), src.size(), &sig[me], 1, SignalOp::set, stalled);
      const int w[] = {stalled};
      ctx.wait_until(reply.data(), Cmp::ge, 1, {.writers = w, .what = "the stalled rank's reply"});
    } catch (const Error& e) {
      timed_out = true;
      EXPECT_EQ(e.code(), Errc::timeout) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(stalled)), std::string::npos) << e.what();
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(timed_out) << "the wait returned although rank 1 stalled (after " << took << " s)";
    EXPECT_LT(took, kStallSeconds - 3.0) << "the timeout fired only once the stalled rank woke up";
  }
  // Rank 1 comes back: the flush that timed out completes (MPI progresses in the barrier), the reply
  // arrives, and the context is healthy again and finalizes.
  MPI_Barrier(MPI_COMM_WORLD);
  if (me != stalled) EXPECT_EQ(ctx.wait_until(reply.data(), Cmp::ge, 1), 1u);
  ctx.quiet();
  ctx.barrier();
  ctx.finalize();
}

}  // namespace
}  // namespace ubep
