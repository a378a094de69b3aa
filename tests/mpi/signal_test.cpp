// Signals: put_signal/wait_until semantics on every route, at 2, 3 and 4 ranks (CTest runs this file
// under the default route and with UBEP_TRANSPORTS=mpi).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "tests/mpi/test_util.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

using test::expect_error;
using test::pattern;

Options heap(std::size_t mib = 32) {
  Options o = Options::from_env();
  o.heap_size = mib << 20;
  return o;
}

std::uint64_t checksum(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

// The payload of a put_signal is complete whenever its signal is observed: the sender writes a
// payload that ends in its checksum, the receiver checks it right after the wait returns.
TEST(Signal, PayloadVisibleWhenSignalObserved) {
  Context ctx(MPI_COMM_WORLD, heap(40));
  const int me = ctx.rank(), n = ctx.size(), right = (me + 1) % n, left = (me + n - 1) % n;
  const std::size_t max = 4u << 20;
  auto buf = ctx.alloc<std::uint8_t>(max + 8);
  auto sig = ctx.alloc_signals(1);
  std::vector<std::uint8_t> src(max + 8);
  std::uint64_t epoch = 0;
  for (const bool nbi : {false, true}) {
    for (const SignalOp op : {SignalOp::set, SignalOp::add}) {
      for (std::size_t size : {std::size_t{1}, std::size_t{8}, std::size_t{100}, std::size_t{4096},
                               std::size_t{65536 + 3}, std::size_t{1} << 20, max}) {
        ++epoch;
        for (std::size_t i = 0; i < size; ++i) src[i] = pattern(me, i, static_cast<unsigned>(epoch));
        const std::uint64_t sum = checksum(src.data(), size);
        std::memcpy(src.data() + size, &sum, 8);
        const std::uint64_t value = op == SignalOp::set ? epoch : 1;
        if (nbi) {
          ctx.put_signal_nbi(buf.data(), src.data(), size + 8, sig.data(), value, op, right);
        } else {
          ctx.put_signal(buf.data(), src.data(), size + 8, sig.data(), value, op, right);
        }
        const int w[] = {left};
        EXPECT_EQ(ctx.wait_until(sig.data(), Cmp::ge, epoch, {.writers = w}), epoch);
        std::uint64_t got = 0;
        std::memcpy(&got, buf.data() + size, 8);
        EXPECT_EQ(got, checksum(buf.data(), size)) << "size " << size << (nbi ? " nbi " : " ") << to_string(op);
        bool ok = true;
        for (std::size_t i = 0; i < size && ok; ++i) ok = buf[i] == pattern(left, i, static_cast<unsigned>(epoch));
        EXPECT_TRUE(ok) << "payload from rank " << left << " size " << size;
        ctx.quiet();    // our source buffer is reused next round
        ctx.barrier();  // the receiver has read buf before the next round overwrites it
      }
    }
  }
  ctx.finalize();
}

// Rank 0 starts a token; each rank waits for it, adds its rank to the payload and forwards it.
TEST(Signal, RingForwarding) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), right = (me + 1) % n;
  auto token = ctx.alloc<std::uint64_t>(64);
  auto sig = ctx.alloc_signals(1);
  constexpr std::uint64_t kRounds = 2000;
  std::vector<std::uint64_t> payload(64);
  const std::uint64_t per_round = static_cast<std::uint64_t>(n) * (n - 1) / 2;
  for (std::uint64_t round = 1; round <= kRounds; ++round) {
    if (me == 0) {
      std::fill(payload.begin(), payload.end(), round * 1000);
    } else {
      ctx.wait_until(sig.data(), Cmp::ge, round);
      std::copy(token.data(), token.data() + 64, payload.begin());
      for (auto& v : payload) v += me;
    }
    ctx.put_signal(token.data(), payload.data(), 64 * 8, sig.data(), round, SignalOp::set, right);
    if (me == 0) {
      ctx.wait_until(sig.data(), Cmp::ge, round);
      for (std::size_t i = 0; i < 64; ++i) ASSERT_EQ(token[i], round * 1000 + per_round) << "round " << round;
    }
  }
  ctx.finalize();
}

TEST(Signal, ComparisonsReturnValuesAndSets) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), right = (me + 1) % n;
  auto sigs = ctx.alloc_signals(4, 10);
  std::span<const std::uint64_t> all(sigs.data(), 4);
  // Already satisfied: returns at once with the value.
  EXPECT_EQ(ctx.wait_until(&sigs[0], Cmp::eq, 10), 10u);
  EXPECT_EQ(ctx.wait_until(&sigs[0], Cmp::ne, 11), 10u);
  EXPECT_EQ(ctx.wait_until(&sigs[0], Cmp::gt, 9), 10u);
  EXPECT_EQ(ctx.wait_until(&sigs[0], Cmp::ge, 10), 10u);
  EXPECT_EQ(ctx.wait_until(&sigs[0], Cmp::lt, 11), 10u);
  EXPECT_EQ(ctx.wait_until(&sigs[0], Cmp::le, 10), 10u);
  EXPECT_TRUE(ctx.test(&sigs[0], Cmp::eq, 10));
  EXPECT_FALSE(ctx.test(&sigs[0], Cmp::gt, 10));
  EXPECT_TRUE(ctx.test_all(all, Cmp::ge, 10));
  EXPECT_FALSE(ctx.test_any(all, Cmp::gt, 10).has_value());
  EXPECT_TRUE(ctx.test_some(all, Cmp::gt, 10).empty());
  ctx.barrier();

  // Satisfied later, one comparison per step: the left neighbour drives our signals.
  // step 1: sig[2] = 20 (eq / gt / ne)
  ctx.signal_op(&sigs[2], 20, SignalOp::set, right);
  EXPECT_EQ(ctx.wait_until(&sigs[2], Cmp::eq, 20), 20u);
  EXPECT_EQ(ctx.wait_until_any(all, Cmp::gt, 10), 2u);
  EXPECT_EQ(ctx.wait_until_some(all, Cmp::ne, 10), (std::vector<std::size_t>{2}));
  ctx.barrier();
  // step 2: sig[1] and sig[3] go down to 5 (lt / le)
  ctx.signal_op(&sigs[1], 5, SignalOp::set, right);
  ctx.signal_op(&sigs[3], 5, SignalOp::set, right);
  EXPECT_EQ(ctx.wait_until(&sigs[3], Cmp::lt, 10), 5u);
  EXPECT_EQ(ctx.wait_until(&sigs[1], Cmp::le, 5), 5u);
  EXPECT_EQ(ctx.wait_until_some(all, Cmp::lt, 10), (std::vector<std::size_t>{1, 3}));
  ctx.barrier();
  // step 3: per-signal values, add from the neighbour
  for (int i = 0; i < 4; ++i) ctx.signal_op(&sigs[i], 100, SignalOp::add, right);
  const std::uint64_t want[] = {110, 105, 120, 105};
  ctx.wait_until_all(all, Cmp::eq, want);
  EXPECT_EQ(ctx.wait_until_any(all, Cmp::ge, want), 0u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ctx.signal_fetch(&sigs[i]), want[i]);
  // kSignalIgnored leaves a signal out: not required by all, never returned by some, not in the report.
  constexpr std::uint64_t X = kSignalIgnored;
  const std::uint64_t half[] = {110, X, 120, X};
  ctx.wait_until_all(all, Cmp::eq, half);
  const std::uint64_t odd[] = {X, 0, X, 0};
  EXPECT_EQ(ctx.wait_until_some(all, Cmp::ge, odd), (std::vector<std::size_t>{1, 3}));
  const std::uint64_t one[] = {X, 999, X, X};
  expect_error(Errc::timeout,
               [&] { (void)ctx.wait_until_any(all, Cmp::ge, one, {.timeout = std::chrono::milliseconds(200)}); },
               {"signal[1]", "1 of 1 unsatisfied"});
  try {
    (void)ctx.wait_until_any(all, Cmp::ge, one, {.timeout = std::chrono::milliseconds(50)});
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("signal[0]"), std::string::npos) << e.what();
  }
  const std::uint64_t none[] = {X, X, X, X};
  expect_error(Errc::invalid_argument, [&] { (void)ctx.wait_until_some(all, Cmp::ge, none); }, {"empty set"});
  // Bad sets are errors, not hangs.
  const std::uint64_t three[] = {1, 2, 3};
  expect_error(Errc::invalid_argument, [&] { ctx.wait_until_all(all, Cmp::eq, three); },
               {"3 values given for 4 signals"});
  expect_error(Errc::invalid_argument, [&] { (void)ctx.wait_until_any({}, Cmp::eq, 1); }, {"empty set"});
  ctx.finalize();
}

// Every rank adds into one word on every rank, many times, in a mix of put_signal and signal_op.
TEST(Signal, ManyWritersAddExactly) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int n = ctx.size();
  auto sig = ctx.alloc_signals(1);
  auto dummy = ctx.alloc<std::uint64_t>(1);
  constexpr std::uint64_t kAdds = 3000;
  for (std::uint64_t i = 0; i < kAdds; ++i) {
    for (int pe = 0; pe < n; ++pe) {
      if (i % 2) {
        ctx.signal_op(sig.data(), 1, SignalOp::add, pe);
      } else {
        ctx.put_signal_nbi(dummy.data(), &i, 8, sig.data(), 1, SignalOp::add, pe);
      }
    }
    if (i % 64 == 0) ctx.quiet();
  }
  ctx.quiet();
  EXPECT_EQ(ctx.wait_until(sig.data(), Cmp::ge, kAdds * n), kAdds * n);
  ctx.barrier();
  EXPECT_EQ(ctx.signal_fetch(sig.data()), kAdds * n) << "an add was lost or duplicated";
  ctx.finalize();
}

// Updates of one word from one origin land in program order, also when deferred and batched: a run of
// `set` signals ends with the last value, and an `add` after a `set` adds to it (on the mpi route a set
// may be an MPI_Put, which MPI orders with nothing unless ubep flushes in between).
TEST(Signal, OneWordUpdatesKeepProgramOrder) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), right = (me + 1) % n;
  auto sig = ctx.alloc_signals(2);
  auto data = ctx.alloc<std::uint64_t>(1);
  constexpr std::uint64_t kRounds = 200;
  for (std::uint64_t round = 1; round <= kRounds; ++round) {
    const std::uint64_t base = round * 1000;
    for (std::uint64_t k = 1; k <= 8; ++k) ctx.signal_op(&sig[0], base + k, SignalOp::set, right);
    ctx.put_signal_nbi(data.data(), &base, 8, &sig[0], base + 9, SignalOp::set, right);
    ctx.signal_op(&sig[0], 1, SignalOp::add, right);
    ctx.signal_op(&sig[1], round, SignalOp::set, right);  // "round done", after the word above
    ctx.quiet();
    const int w[] = {(me + n - 1) % n};
    ctx.wait_until(&sig[1], Cmp::ge, round, {.writers = w});
    ASSERT_EQ(ctx.signal_fetch(&sig[0]), base + 10) << "round " << round << ": updates of one word reordered";
    ctx.barrier();  // nobody starts the next round before everyone has checked this one
  }
  ctx.finalize();
}

// Epoch protocol without resets: 100 000 rounds of "add 1, wait for the next epoch" around a ring.
TEST(Signal, MonotonicEpochsWithoutReset) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), right = (me + 1) % n, left = (me + n - 1) % n;
  auto sig = ctx.alloc_signals(1);
  constexpr std::uint64_t kRounds = 100000;
  const int w[] = {left};
  for (std::uint64_t round = 1; round <= kRounds; ++round) {
    ctx.signal_op(sig.data(), 1, SignalOp::add, right);
    const std::uint64_t v = ctx.wait_until(sig.data(), Cmp::ge, round, {.writers = w});
    // Each rank is at most one round ahead of its left neighbour, so the left neighbour is at most
    // n - 1 rounds ahead of us: anything outside [round, round + n - 1] is a lost or invented add.
    ASSERT_TRUE(v >= round && v <= round + n - 1) << "round " << round << ": signal " << v;
  }
  ctx.finalize();
}

// A rank that sleeps outside ubep must not hold its peers back: puts into its memory complete and the
// peer can go on; once awake it sees the data.
TEST(Signal, SleepingTargetDoesNotStallPeers) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size();
  auto buf = ctx.alloc<std::uint8_t>(1u << 20);
  auto sig = ctx.alloc_signals(1);
  ctx.barrier();
  const auto sleep = std::chrono::milliseconds(1500);
  if (me == 1) {
    std::this_thread::sleep_for(sleep);  // "computing", no ubep or MPI call
    const int w[] = {0};
    ctx.wait_until(sig.data(), Cmp::eq, 1, {.writers = w});
    bool ok = true;
    for (std::size_t i = 0; i < (1u << 20) && ok; ++i) ok = buf[i] == pattern(0, i);
    EXPECT_TRUE(ok);
  } else if (me == 0) {
    std::vector<std::uint8_t> src(1u << 20);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = pattern(0, i);
    const auto t0 = std::chrono::steady_clock::now();
    ctx.put_signal(buf.data(), src.data(), src.size(), sig.data(), 1, SignalOp::set, 1);
    ctx.quiet();
    const auto took = std::chrono::steady_clock::now() - t0;
    // The sleeper's stall may cost at most its sleep (a target-progress MPI path); never more.
    EXPECT_LT(took, sleep + std::chrono::milliseconds(1000));
  }
  (void)n;
  ctx.barrier();
  ctx.finalize();
}

// A wait that can never be satisfied ends with a timeout error, on every rank, naming the missing peer.
TEST(Signal, TimeoutNamesTheMissingPeer) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), left = (me + n - 1) % n;
  auto sig = ctx.alloc_signals(3);
  const int writers[] = {left, left, (me + 1) % n};
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(Errc::timeout,
               [&] {
                 ctx.wait_until_all(
                     {sig.data(), 3}, Cmp::ge, 1,
                     {.timeout = std::chrono::milliseconds(500), .writers = writers, .what = "test epoch"});
               },
               {"rank " + std::to_string(me), "wait_until_all", "test epoch", "signal[0]", "waiting for >= 1",
                "expected writer: rank " + std::to_string(left), "peers that have not written"});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 5.0) << "the timeout fired far too late";
  // The context is still usable afterwards.
  ctx.barrier();
  ctx.finalize();
}

}  // namespace
}  // namespace ubep
