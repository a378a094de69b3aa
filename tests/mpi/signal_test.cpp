// Signals: put_signal/wait_until semantics on every route, at 2, 3 and 4 ranks (CTest runs this file
// under the default route and with UBEP_TRANSPORTS=mpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>
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

// How many rounds a stress loop runs: `local` where every rank reaches every peer by load/store (self,
// shm: a round costs about a microsecond), `remote` where any rank has a message route (mpi, ucx: up to a
// millisecond over the emulated nodes' TCP). Agreed by all ranks, so a ring runs the same rounds everywhere.
std::uint64_t rounds(const Context& ctx, std::uint64_t local, std::uint64_t remote) {
  int all_local = 1;
  for (int pe = 0; pe < ctx.size(); ++pe)
    if (ctx.route(pe) != Route::self && ctx.route(pe) != Route::shm) all_local = 0;
  EXPECT_EQ(MPI_Allreduce(MPI_IN_PLACE, &all_local, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), MPI_SUCCESS);
  return all_local ? local : remote;
}

std::uint64_t checksum(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

// The payload of a put_signal is complete whenever its signal is observed: the sender writes a
// payload that ends in its checksum (put_signal moves size + 8 bytes), the receiver checks it right after
// the wait returns; then each rank reads back with get() what it wrote to its right neighbour.
void payload_visible_when_signal_observed(const Options& options, std::initializer_list<std::size_t> sizes) {
  Context ctx(MPI_COMM_WORLD, options);
  const int me = ctx.rank(), n = ctx.size(), right = (me + 1) % n, left = (me + n - 1) % n;
  const std::size_t max = std::max(sizes);
  auto buf = ctx.alloc<std::uint8_t>(max + 8);
  auto sig = ctx.alloc_signals(1);
  std::vector<std::uint8_t> src(max + 8), back(max + 8);
  std::uint64_t epoch = 0;
  for (const bool nbi : {false, true}) {
    for (const SignalOp op : {SignalOp::set, SignalOp::add}) {
      for (std::size_t size : sizes) {
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
        ctx.get(back.data(), buf.data(), size + 8, right);
        EXPECT_EQ(std::memcmp(back.data(), src.data(), size + 8), 0)
            << "get of " << size + 8 << " bytes from rank " << right;
        ctx.barrier();  // every get is done before the next round overwrites buf
      }
    }
  }
  ctx.finalize();
}

TEST(Signal, PayloadVisibleWhenSignalObserved) {
  payload_visible_when_signal_observed(heap(40), {1, 8, 100, 4096, 65536 + 3, std::size_t{1} << 20, 4u << 20});
}

// The same where each message takes the other protocol of the ucx route (UBEP_UCX_EAGER_MAX; inert on the other
// routes): everything by rendezvous (0), the limit at 4 KiB and at its default, UCX's own choice (auto). The
// sizes sit on both sides of each limit (a put_signal moves size + 8 bytes).
TEST(Signal, PayloadVisibleAtEveryEagerLimit) {
  for (const std::size_t eager_max : {std::size_t{0}, std::size_t{4096}, Options{}.ucx_eager_max, kUcxEagerAuto}) {
    SCOPED_TRACE("UBEP_UCX_EAGER_MAX=" +
                 (eager_max == kUcxEagerAuto ? std::string("auto") : std::to_string(eager_max)));
    Options o = heap(8);
    o.ucx_eager_max = eager_max;
    payload_visible_when_signal_observed(
        o, {0, 1, 4096 - 8, 4096 - 7, 16384 + 5, (256u << 10) + 5, (1u << 20) - 8, (1u << 20) - 7});
  }
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
  const std::uint64_t adds = rounds(ctx, 3000, 1000);
  // The source of a put_signal_nbi may be reused only after quiet(): one word that outlives the loop
  // and never changes (not the loop variable, which changes every iteration and is gone at the last
  // quiet; ASan caught UCX reading it there as stack-use-after-scope).
  const std::uint64_t payload = 0x5eed'0000'0000'0001ULL;
  for (std::uint64_t i = 0; i < adds; ++i) {
    for (int pe = 0; pe < n; ++pe) {
      if (i % 2) {
        ctx.signal_op(sig.data(), 1, SignalOp::add, pe);
      } else {
        ctx.put_signal_nbi(dummy.data(), &payload, 8, sig.data(), 1, SignalOp::add, pe);
      }
    }
    if (i % 64 == 0) ctx.quiet();
  }
  ctx.quiet();
  EXPECT_EQ(ctx.wait_until(sig.data(), Cmp::ge, adds * n), adds * n);
  ctx.barrier();
  EXPECT_EQ(ctx.signal_fetch(sig.data()), adds * n) << "an add was lost or duplicated";
  EXPECT_EQ(dummy[0], payload) << "the put_signal_nbi payload";
  ctx.finalize();
}

// barrier() completes every rank's signals at their targets: right after it, each rank's words hold what
// every peer added, read as plain memory (no wait). With signals as messages (UBEP_MPI_SIGNAL=message) the
// barrier itself applies the messages sent to this rank before the peers' barriers.
TEST(Signal, BarrierCompletesSignalsEverywhere) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size();
  auto sig = ctx.alloc_signals(static_cast<std::size_t>(n));
  for (std::uint64_t round = 1; round <= 20; ++round) {
    for (int pe = 0; pe < n; ++pe) {  // word `me` of every rank: round*(me+1) added in two steps
      ctx.signal_op(&sig[static_cast<std::size_t>(me)], round * static_cast<std::uint64_t>(me), SignalOp::add, pe);
      ctx.signal_op(&sig[static_cast<std::size_t>(me)], round, SignalOp::add, pe);
    }
    ctx.barrier();
    for (int from = 0; from < n; ++from) {
      const std::uint64_t want = static_cast<std::uint64_t>(from + 1) * round * (round + 1) / 2;
      ASSERT_EQ(std::atomic_ref<std::uint64_t>(sig[static_cast<std::size_t>(from)]).load(), want)
          << "round " << round << ": rank " << me << "'s word of rank " << from << " after the barrier";
    }
    ctx.barrier();
  }
  ctx.finalize();
}

// A signal aimed at an object that is then freed never changes the object that reuses its block: alloc
// completes (with signals as messages: applies) every signal sent before it. The ping from the same origin
// arrives after the stale signal, so by its wait the stale one would have landed.
TEST(Signal, SignalsToAFreedObjectNeverReachTheNextOne) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), right = (me + 1) % n;
  for (std::uint64_t round = 1; round <= 20; ++round) {
    const std::uint64_t* old_word = nullptr;
    {
      auto old = ctx.alloc_signals(1);
      old_word = old.data();
      ctx.signal_op(old.data(), 1000 + round, SignalOp::set, right);
    }  // released locally, its signal possibly still on the way
    auto fresh = ctx.alloc_signals(1, 7);
    auto ping = ctx.alloc_signals(1);
    ctx.signal_op(ping.data(), round, SignalOp::set, right);
    ctx.wait_until(ping.data(), Cmp::ge, round);
    ASSERT_EQ(std::atomic_ref<std::uint64_t>(fresh[0]).load(), 7u)
        << "round " << round << ": a signal to the freed object changed the new one"
        << (fresh.data() == old_word ? " (same block)" : "");
    ctx.barrier();
  }
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
  const std::uint64_t total = rounds(ctx, 100000, 20000);
  const int w[] = {left};
  for (std::uint64_t round = 1; round <= total; ++round) {
    ctx.signal_op(sig.data(), 1, SignalOp::add, right);
    const std::uint64_t v = ctx.wait_until(sig.data(), Cmp::ge, round, {.writers = w});
    // Each rank is at most one round ahead of its left neighbour, so the left neighbour is at most
    // n - 1 rounds ahead of us: anything outside [round, round + n - 1] is a lost or invented add.
    ASSERT_TRUE(v >= round && v <= round + n - 1) << "round " << round << ": signal " << v;
  }
  ctx.finalize();
}

// Flags in memory that the ranks of one node share (MPI_Win_allocate_shared of the test's own, read and
// written with plain atomic loads and stores): a rank that polls them makes no MPI call.
class NodeFlags {
 public:
  NodeFlags(MPI_Comm comm, int count) {
    EXPECT_EQ(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_), MPI_SUCCESS);
    int node_rank = 0;
    MPI_Comm_rank(node_, &node_rank);
    const MPI_Aint bytes = node_rank == 0 ? (count * 8 + 63) / 64 * 64 : 0;
    void* mine = nullptr;
    EXPECT_EQ(MPI_Win_allocate_shared(bytes, 8, MPI_INFO_NULL, node_, &mine, &win_), MPI_SUCCESS);
    MPI_Aint size = 0;
    int unit = 0;
    EXPECT_EQ(MPI_Win_shared_query(win_, 0, &size, &unit, &base_), MPI_SUCCESS);
    if (node_rank == 0) std::fill(flags(), flags() + count, 0);
    MPI_Barrier(node_);
  }
  NodeFlags(const NodeFlags&) = delete;
  NodeFlags& operator=(const NodeFlags&) = delete;
  ~NodeFlags() {
    MPI_Win_free(&win_);
    MPI_Comm_free(&node_);
  }
  /// World ranks on this node.
  std::vector<int> members(MPI_Comm world) const {
    int me = 0, size = 0;
    MPI_Comm_rank(world, &me);
    MPI_Comm_size(node_, &size);
    std::vector<int> all(size);
    MPI_Allgather(&me, 1, MPI_INT, all.data(), 1, MPI_INT, node_);
    return all;
  }
  void raise(int i) { std::atomic_ref<std::uint64_t>(flags()[i]).store(1, std::memory_order_release); }
  bool raised(int i) { return std::atomic_ref<std::uint64_t>(flags()[i]).load(std::memory_order_acquire) == 1; }

 private:
  std::uint64_t* flags() { return static_cast<std::uint64_t*>(base_); }
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  void* base_ = nullptr;
};

// A rank that sleeps (computes outside ubep: no ubep or MPI call) must not hold its peers back. Judged
// by order, not by time: the sleeper makes no call until the ranks of its node have raised a flag in
// memory it shares with them (NodeFlags); a peer held back never raises it, and the sleeper gives up at a
// deadline that only a failure reaches. Among the sleeper's node-mates:
//  - the first one (the talker) put_signals 1 MiB into the sleeper, quiet()s, then raises its flag.
//    Where it reaches the sleeper by load/store alone (shm or self route, signals not through MPI), the
//    flag must come while the sleeper sleeps. Through MPI, RMA without asynchronous progress may need the
//    target (measured here: Open MPI 4.1 osc ucx on MPI_Win_create windows, MPICH 4.0.2 on every window),
//    so there it is required only with UBEP_PROGRESS_THREAD=1, whose thread progresses for the sleeper.
//  - the others (bystanders) run a ring of put_signal + wait among themselves on the same routes, then
//    raise their flags: on every route these must come while the sleeper sleeps.
// Once awake the sleeper sees the talker's data. Ranks on other nodes only take part in the barriers.
TEST(Signal, SleepingTargetDoesNotStallPeers) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), sleeper = 1;
  constexpr std::size_t kSlice = 1u << 20;
  constexpr std::uint64_t kRounds = 20, kWords = 64;
  NodeFlags flags(ctx.comm(), n);
  std::vector<int> mates = flags.members(ctx.comm());
  const bool sleeper_here = std::find(mates.begin(), mates.end(), sleeper) != mates.end();
  std::sort(mates.begin(), mates.end());
  std::erase(mates, sleeper);
  const int talker = sleeper_here && !mates.empty() ? mates.front() : -1;
  const std::vector<int> bystanders(mates.begin() + (talker >= 0 ? 1 : 0), mates.end());
  const bool bystander = sleeper_here && std::find(bystanders.begin(), bystanders.end(), me) != bystanders.end();
  auto buf = ctx.alloc<std::uint8_t>(kSlice);
  auto ring = ctx.alloc<std::uint64_t>(kRounds * kWords);
  auto sig = ctx.alloc_signals(2);  // [0] the talker's data is in, [1] the bystanders' ring
  ctx.barrier();
  if (me == sleeper) {
    // Load/store data and atomics land without the target; MPI RMA and UCX active messages need its
    // progress (or a progress thread).
    const auto& used = ctx.info().transports;
    const bool load_store = talker >= 0 && (ctx.route(talker) == Route::self || ctx.route(talker) == Route::shm) &&
                            !ctx.atomics_through_mpi() && std::find(used.begin(), used.end(), "ucx") == used.end();
    const bool talker_due = talker >= 0 && (load_store || ctx.options().progress_thread == ubep::ProgressThread::on);
    std::vector<int> due(bystanders);
    if (talker_due) due.push_back(talker);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto all_raised = [&] { return std::all_of(due.begin(), due.end(), [&](int r) { return flags.raised(r); }); };
    while (!all_raised() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Still asleep: what has arrived by now arrived without this rank.
    for (int r : due)
      EXPECT_TRUE(flags.raised(r)) << "rank " << r << (r == talker ? " (talker, " : " (bystander, ")
                                   << to_string(ctx.route(r)) << " route) was held back by a sleeping rank";
    if (talker_due && flags.raised(talker)) {
      EXPECT_EQ(ctx.signal_fetch(&sig[0]), 1u) << "the talker's quiet() returned before its signal landed";
      bool ok = true;
      for (std::size_t i = 0; i < kSlice && ok; ++i) ok = buf[i] == pattern(talker, i);
      EXPECT_TRUE(ok) << "the talker's payload is not complete after its quiet()";
    }
    // Awake.
    if (talker >= 0) {
      const int w[] = {talker};
      ctx.wait_until(&sig[0], Cmp::eq, 1, {.writers = w});
      bool ok = true;
      for (std::size_t i = 0; i < kSlice && ok; ++i) ok = buf[i] == pattern(talker, i);
      EXPECT_TRUE(ok) << "payload from rank " << talker;
    }
  } else if (me == talker) {
    std::vector<std::uint8_t> src(kSlice);
    for (std::size_t i = 0; i < kSlice; ++i) src[i] = pattern(me, i);
    ctx.put_signal(buf.data(), src.data(), kSlice, &sig[0], 1, SignalOp::set, sleeper);
    ctx.quiet();  // remote completion
    flags.raise(me);
  } else if (bystander) {
    const auto at = std::find(bystanders.begin(), bystanders.end(), me) - bystanders.begin();
    const auto nb = static_cast<std::ptrdiff_t>(bystanders.size());
    const int next = bystanders[(at + 1) % nb], prev = bystanders[(at + nb - 1) % nb];
    std::vector<std::uint64_t> words(kRounds * kWords);
    for (std::uint64_t round = 1; round <= kRounds; ++round) {
      std::uint64_t* slot = words.data() + (round - 1) * kWords;
      for (std::uint64_t k = 0; k < kWords; ++k) slot[k] = static_cast<std::uint64_t>(me) << 32 | round << 8 | k;
      ctx.put_signal(ring.data() + (round - 1) * kWords, slot, kWords * 8, &sig[1], round, SignalOp::set, next);
      const int w[] = {prev};
      ctx.wait_until(&sig[1], Cmp::ge, round, {.writers = w});
      const std::uint64_t* got = ring.data() + (round - 1) * kWords;
      std::uint64_t bad = 0;
      for (std::uint64_t k = 0; k < kWords; ++k)
        bad += got[k] != (static_cast<std::uint64_t>(prev) << 32 | round << 8 | k);
      EXPECT_EQ(bad, 0u) << "ring round " << round << " from rank " << prev;
    }
    ctx.quiet();
    flags.raise(me);
  }
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

// wait_until on one word polls it as one load (no vector of satisfied indices): the same deadline, the same
// report and the same argument checks as the wait_until_* family.
TEST(Signal, SingleWaitTimesOutNamingItsSignalAndWriter) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int me = ctx.rank(), n = ctx.size(), left = (me + n - 1) % n;
  auto sig = ctx.alloc_signals(2);
  const int writer[] = {left};
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(Errc::timeout,
               [&] {
                 ctx.wait_until(&sig[1], Cmp::eq, 7,
                                {.timeout = std::chrono::milliseconds(300), .writers = writer, .what = "one word"});
               },
               {"rank " + std::to_string(me), "wait_until", "one word", "signal[0]", "= 0, waiting for == 7",
                "expected writer: rank " + std::to_string(left), "1 of 1 unsatisfied"});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 5.0) << "the timeout fired far too late";
  const int bad[] = {n};
  expect_error(Errc::out_of_range, [&] { ctx.wait_until(&sig[1], Cmp::ge, 1, {.writers = bad}); },
               {"wait_until", "writers[0] = " + std::to_string(n)});
  ctx.barrier();  // every rank is done with the unwritten word
  // It returns the value that met the condition, after the left neighbour's put_signal.
  std::uint64_t word = 0;
  ctx.put_signal(&sig[0], &word, 0, &sig[1], 40 + static_cast<std::uint64_t>(me), SignalOp::set, (me + 1) % n);
  EXPECT_EQ(ctx.wait_until(&sig[1], Cmp::gt, 39, {.writers = writer}), 40 + static_cast<std::uint64_t>(left));
  ctx.barrier();
  ctx.finalize();
}

// put_signal and put_signal_nbi check every argument on every route, the load/store fast path included
// (a bad argument there falls through to the full path, which names the first bad one): rank, call and
// value in the error, nothing written anywhere, and the calls work afterwards.
TEST(Signal, PutSignalBadInputIsReportedAndWritesNothing) {
  Context ctx(MPI_COMM_WORLD, heap());
  const int n = ctx.size(), me = ctx.rank(), right = (me + 1) % n;
  const std::string who = "rank " + std::to_string(me);
  auto buf = ctx.alloc<std::uint64_t>(4);
  auto sig = ctx.alloc_signals(2);
  std::fill(buf.data(), buf.data() + 4, 0);
  ctx.barrier();
  std::uint64_t src[4] = {11, 12, 13, 14};
  std::uint64_t local = 0;
  auto* misaligned = reinterpret_cast<std::uint64_t*>(reinterpret_cast<char*>(sig.data()) + 4);
  for (const bool nbi : {false, true}) {
    const std::string call = nbi ? "put_signal_nbi" : "put_signal";
    const auto put_signal = [&](void* dest, std::size_t bytes, std::uint64_t* word, int pe) {
      if (nbi) {
        ctx.put_signal_nbi(dest, src, bytes, word, 5, SignalOp::set, pe);
      } else {
        ctx.put_signal(dest, src, bytes, word, 5, SignalOp::set, pe);
      }
    };
    expect_error(Errc::out_of_range, [&] { put_signal(buf.data(), 8, sig.data(), n); },
                 {who, call, "target rank " + std::to_string(n)});
    expect_error(Errc::out_of_range, [&] { put_signal(buf.data(), 8, sig.data(), -1); }, {who, call, "-1"});
    expect_error(Errc::out_of_range, [&] { put_signal(buf.data() + 3, 16, sig.data(), right); },
                 {who, call, "runs past the end of its object"});
    expect_error(Errc::not_symmetric, [&] { put_signal(&local, 8, sig.data(), right); },
                 {who, call, "not in the symmetric heap"});
    expect_error(Errc::not_symmetric, [&] { put_signal(buf.data(), 8, &local, right); },
                 {who, call, "not in the symmetric heap"});
    expect_error(Errc::misaligned, [&] { put_signal(buf.data(), 8, misaligned, right); },
                 {who, call, "8-byte aligned"});
    expect_error(Errc::out_of_range, [&] { put_signal(buf.data(), std::size_t{1} << 62, sig.data(), right); },
                 {who, call, "symmetric heap"});
  }
  ctx.quiet();
  ctx.barrier();  // every rank's bad calls are behind it: none wrote anything anywhere
  for (int i = 0; i < 4; ++i) EXPECT_EQ(buf[i], 0u) << "buf[" << i << "] written by a refused call";
  EXPECT_EQ(ctx.signal_fetch(&sig[0]), 0u);
  EXPECT_EQ(ctx.signal_fetch(&sig[1]), 0u);
  ctx.barrier();
  // Both calls still work: data, then the signal that publishes it.
  ctx.put_signal(buf.data(), src, 16, &sig[0], 1, SignalOp::set, right);
  ctx.put_signal_nbi(buf.data() + 2, src + 2, 16, &sig[1], 2, SignalOp::add, right);
  EXPECT_EQ(ctx.wait_until(&sig[0], Cmp::eq, 1), 1u);
  EXPECT_EQ(ctx.wait_until(&sig[1], Cmp::eq, 2), 2u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(buf[i], src[i]) << "buf[" << i << "]";
  ctx.quiet();
  ctx.barrier();
  std::uint64_t* dest = buf.data();
  std::uint64_t* word = sig.data();
  ctx.finalize();
  expect_error(Errc::finalized, [&] { ctx.put_signal(dest, src, 8, word, 1, SignalOp::set, right); },
               {"put_signal", "finalized"});
  expect_error(Errc::finalized, [&] { ctx.put_signal_nbi(dest, src, 8, word, 1, SignalOp::set, right); },
               {"put_signal_nbi", "finalized"});
}

}  // namespace
}  // namespace ubep
