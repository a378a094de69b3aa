// Put/get/atomics on every route (the CTest registration runs this under the default route and with
// UBEP_TRANSPORTS=mpi), at 2, 3 and 4 ranks. Mirrors the usual MPI RMA test suites.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "tests/mpi/test_util.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

using test::expect_error;
using test::pattern;

Options small_heap() {
  Options o = Options::from_env();
  o.heap_size = 32u << 20;
  return o;
}

TEST(Rma, RouteTableMatchesTransports) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  const auto& t = ctx.options().transports;
  const auto allowed = [&](const char* name) { return std::find(t.begin(), t.end(), name) != t.end(); };
  // Off the node: ucx when named (it is preferred over mpi), else mpi; "forced": neither self nor shm.
  const Route far = allowed("ucx") ? Route::ucx : Route::mpi;
  const bool forced = !allowed("self") && !allowed("shm");
  const auto node = ctx.node_ranks();
  bool off_node = false;
  for (int pe = 0; pe < ctx.size(); ++pe) {
    const bool same_node = std::find(node.begin(), node.end(), pe) != node.end();
    off_node = off_node || !same_node;
    if (forced || !same_node || (pe != ctx.rank() && !allowed("shm"))) {  // self,mpi (simulation): mpi on the node
      EXPECT_EQ(ctx.route(pe), far) << "pe " << pe;
    } else if (pe == ctx.rank()) {
      EXPECT_EQ(ctx.route(pe), Route::self);
    } else {
      EXPECT_EQ(ctx.route(pe), Route::shm) << "pe " << pe << " is on this node";
    }
  }
  EXPECT_EQ(ctx.atomics_through_mpi(),
            far == Route::mpi && (forced || off_node || (!allowed("shm") && ctx.size() > 1)));
  // Under tests/multinode/emulate.sh the ranks really are on different (emulated) hosts.
  if (const char* n = std::getenv("UBEP_EMULATED_NODES")) {
    EXPECT_EQ(ctx.topology().num_nodes(), std::atoi(n));
    EXPECT_TRUE(off_node || ctx.size() <= 1);
    EXPECT_TRUE(ctx.topology().overrides().empty()) << "real hosts, no override";
  }
  ctx.finalize();
}

TEST(Rma, PutGetSizesAndUnalignedOffsets) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int me = ctx.rank(), n = ctx.size();
  const std::size_t max = (4u << 20) + 13;  // >= 4 MiB, odd
  auto buf = ctx.alloc<std::uint8_t>(max + 64);
  std::vector<std::size_t> sizes = {0, 1, 3, 7, 8, 63, 64, 65, 1000, 4096, 65537, 1u << 20, max};
  for (std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{33}}) {
    for (std::size_t size : sizes) {
      std::fill(buf.local().begin(), buf.local().end(), std::uint8_t{0xEE});
      ctx.barrier();
      std::vector<std::uint8_t> src(size);
      for (std::size_t i = 0; i < size; ++i) src[i] = pattern(me, i, static_cast<unsigned>(size + off));
      const int right = (me + 1) % n;
      ctx.put(buf.data() + off, src.data(), size, right);
      ctx.quiet();
      ctx.barrier();
      const int left = (me + n - 1) % n;
      bool ok = buf[off > 0 ? off - 1 : max + 63] == 0xEE && buf[off + size] == 0xEE;
      for (std::size_t i = 0; i < size && ok; ++i)
        ok = buf[off + i] == pattern(left, i, static_cast<unsigned>(size + off));
      EXPECT_TRUE(ok) << "put size " << size << " offset " << off;
      // get it back from the right neighbour: it holds my pattern
      std::vector<std::uint8_t> back(size, 0);
      ctx.get(back.data(), buf.data() + off, size, right);
      EXPECT_EQ(back, src) << "get size " << size << " offset " << off;
      ctx.barrier();
    }
  }
  buf.free();
  ctx.finalize();
}

TEST(Rma, NonBlockingManyOutstandingThenQuiet) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int me = ctx.rank(), n = ctx.size();
  constexpr std::size_t kCount = 5000;
  auto slots = ctx.alloc<std::uint64_t>(kCount * n);
  std::fill(slots.local().begin(), slots.local().end(), 0);
  ctx.barrier();
  std::vector<std::uint64_t> values(kCount);
  for (std::size_t i = 0; i < kCount; ++i) values[i] = (static_cast<std::uint64_t>(me) << 32) | i;
  for (int pe = 0; pe < n; ++pe) {
    for (std::size_t i = 0; i < kCount; ++i) ctx.put_nbi(slots.data() + me * kCount + i, &values[i], 8, pe);
  }
  ctx.quiet();
  ctx.barrier();
  std::size_t bad = 0;
  for (int src = 0; src < n; ++src) {
    std::size_t bad_src = 0;
    for (std::size_t i = 0; i < kCount; ++i)
      bad_src += slots[src * kCount + i] != ((static_cast<std::uint64_t>(src) << 32) | i);
    EXPECT_EQ(bad_src, 0u) << "puts from rank " << src << " missing";
  }
  // get_nbi: the destination is valid after quiet
  std::vector<std::uint64_t> got(kCount, 0);
  const int right = (me + 1) % n;
  for (std::size_t i = 0; i < kCount; ++i) ctx.get_nbi(&got[i], slots.data() + right * kCount + i, 8, right);
  ctx.quiet();
  for (std::size_t i = 0; i < kCount; ++i) bad += got[i] != ((static_cast<std::uint64_t>(right) << 32) | i);
  EXPECT_EQ(bad, 0u);
  ctx.finalize();
}

TEST(Rma, ThirdPartyCompletion) {
  // A puts to B and quiets, then tells C; C reads B and must see A's data.
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int n = ctx.size(), me = ctx.rank();
  const int a = 0, b = 1 % n, c = (n > 2) ? 2 : 0;
  auto data = ctx.alloc<std::uint64_t>(1024);
  auto flag = ctx.alloc_signals(1);
  std::fill(data.local().begin(), data.local().end(), 0);
  ctx.barrier();
  for (std::uint64_t round = 1; round <= 50; ++round) {
    if (me == a) {
      std::vector<std::uint64_t> v(1024, round * 1000 + 7);
      ctx.put(data.data(), v.data(), v.size() * 8, b);
      ctx.quiet();
      ctx.atomic_set(flag.data(), round, c);
      ctx.quiet();
    }
    if (me == c) {
      ctx.wait_until(flag.data(), Cmp::ge, round);
      std::vector<std::uint64_t> v(1024, 0);
      ctx.get(v.data(), data.data(), v.size() * 8, b);
      EXPECT_EQ(std::count(v.begin(), v.end(), round * 1000 + 7), 1024) << "round " << round;
    }
    ctx.barrier();
  }
  ctx.finalize();
}

TEST(Rma, FlushLocalMakesSourcesReusable) {
  // put_nbi from one buffer, flush_local(pe), overwrite the buffer, quiet: pe holds what was put, not
  // the overwrite (2 MiB too: past UBEP_UCX_EAGER_MAX, a rendezvous on the ucx route).
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int n = ctx.size(), me = ctx.rank(), right = (me + 1) % n, left = (me + n - 1) % n;
  for (const std::size_t count : {std::size_t{8}, std::size_t{256} << 10}) {
    auto dst = ctx.alloc<std::uint64_t>(count);
    std::vector<std::uint64_t> src(count);
    for (std::size_t i = 0; i < count; ++i) src[i] = (static_cast<std::uint64_t>(me) << 40) | i;
    ctx.barrier();
    ctx.put_nbi(dst.data(), src.data(), count * 8, right);
    ctx.flush_local(right);
    std::fill(src.begin(), src.end(), ~std::uint64_t{0});  // reused: must not reach `right`
    ctx.quiet();
    ctx.barrier();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < count; ++i) bad += dst[i] != ((static_cast<std::uint64_t>(left) << 40) | i);
    EXPECT_EQ(bad, 0u) << count << " words from rank " << left;
    ctx.barrier();
    dst.free();
  }
  EXPECT_THROW(ctx.flush_local(n), Error);
  ctx.finalize();
}

TEST(Rma, SignalOpIsOrderedAfterPutsToEveryPeer) {
  // A puts to B (no quiet), then signal_op to C; C forwards to B with signal_op; B, seeing C's signal,
  // must see A's data (signal_op is ordered after this rank's puts to every peer).
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 3) GTEST_SKIP() << "needs 3 ranks";  // before the Context: a skip must not leave it unfinalized
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int n = ctx.size(), me = ctx.rank();
  const int a = 0, b = n - 1, c = 1;         // b on another (emulated) node than a where there are two
  constexpr std::size_t kCount = 256 << 10;  // 2 MiB: past UBEP_UCX_EAGER_MAX, a rendezvous on the ucx route
  auto data = ctx.alloc<std::uint64_t>(kCount);
  auto to_c = ctx.alloc_signals(1), to_b = ctx.alloc_signals(1);
  std::fill(data.local().begin(), data.local().end(), 0);
  ctx.barrier();
  for (std::uint64_t round = 1; round <= 20; ++round) {
    if (me == a) {
      std::vector<std::uint64_t> v(kCount, round);
      ctx.put_nbi(data.data(), v.data(), kCount * 8, b);
      ctx.signal_op(to_c.data(), round, SignalOp::set, c);
      ctx.quiet();  // v is reused next round
    }
    if (me == c) {
      ctx.wait_until(to_c.data(), Cmp::ge, round);
      ctx.signal_op(to_b.data(), round, SignalOp::set, b);
    }
    if (me == b) {
      ctx.wait_until(to_b.data(), Cmp::ge, round);
      EXPECT_EQ(std::count(data.local().begin(), data.local().end(), round), static_cast<std::ptrdiff_t>(kCount))
          << "round " << round;
    }
    ctx.barrier();
  }
  ctx.finalize();
}

TEST(Rma, FetchAddContentionIsExact) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  auto counter = ctx.alloc<std::uint64_t>(1);
  counter[0] = 0;
  ctx.barrier();
  // Through MPI (Open MPI 4.1, osc ucx) every atomic first takes the target's accumulate lock by CAS: between
  // emulated nodes a few round trips over TCP that rank 0 serves from inside its barrier, each waiting for rank 0
  // to be scheduled. With 2 CPU hogs on this 2-core machine one atomic took 17 ms, and the lock is unfair: a rank
  // whose CAS keeps losing waits for the others' whole loops, so at 500 iterations one fetch waited over 60 s (the
  // multinode tests' UBEP_WAIT_TIMEOUT) in 1 CI run and in 3 of 25 runs here over 30 s (docs/MULTINODE.md, "Known
  // problems"). 100 iterations keep that wait under 25 s; every rank still contends on one word.
  int through_mpi = ctx.atomics_through_mpi() ? 1 : 0;
  ASSERT_EQ(MPI_Allreduce(MPI_IN_PLACE, &through_mpi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), MPI_SUCCESS);
  const int kIters = through_mpi ? 100 : 2000;
  std::vector<std::uint64_t> seen;
  for (int i = 0; i < kIters; ++i) seen.push_back(ctx.atomic_fetch_add(counter.data(), 1, 0));
  ctx.barrier();
  for (int i = 0; i < kIters; ++i) ctx.atomic_add(counter.data(), 2, 0);
  ctx.barrier();
  const std::uint64_t total = ctx.atomic_fetch(counter.data(), 0);
  // Every rank's fetch answered before any rank blocks in a plain MPI call: on the ucx route rank 0
  // answers only while it calls into ubep (docs/ROUTES.md, "The ucx route").
  ctx.barrier();
  EXPECT_EQ(total, static_cast<std::uint64_t>(ctx.size()) * kIters * 3);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end())) << "fetch_add results from one rank must increase";
  // Every fetched value is unique across ranks: gather them on rank 0.
  std::vector<std::uint64_t> all(static_cast<std::size_t>(ctx.size()) * kIters);
  MPI_Allgather(seen.data(), kIters, MPI_UINT64_T, all.data(), kIters, MPI_UINT64_T, MPI_COMM_WORLD);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a fetch_add value was returned twice";
  ctx.finalize();
}

TEST(Rma, CompareSwapLock) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  if (ctx.atomics_through_mpi() && std::string(lib, len).find("Open MPI v4.1") != std::string::npos) {
    // Known upstream problem, not ubep's: with Open MPI 4.1 (osc ucx) a lock built on MPI_Compare_and_swap
    // sometimes stays taken although its holder's releasing CAS returned success (about 1 run in 3 at
    // 3 ranks); osc rdma segfaults in MPI_Compare_and_swap instead (ompi issues 11349, 9146). See docs/ROUTES.md.
    GTEST_SKIP() << "MPI_Compare_and_swap is unreliable in " << std::string(lib, std::min(len, 20));
  }
  auto lock = ctx.alloc<std::uint64_t>(1);
  auto shared = ctx.alloc<std::uint64_t>(1);
  lock[0] = 0;
  shared[0] = 0;
  ctx.barrier();
  const std::uint64_t me = static_cast<std::uint64_t>(ctx.rank()) + 1;
  constexpr int kIters = 200;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < kIters; ++i) {
    while (ctx.atomic_compare_swap(lock.data(), 0, me, 0) != 0) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the lock was never released";
    }
    // Non-atomic read-modify-write under the lock.
    std::uint64_t v = 0;
    ctx.get(&v, shared.data(), 8, 0);
    ctx.put(shared.data(), &(++v), 8, 0);
    ctx.quiet();
    // Release with compare_swap too: on the mpi route Open MPI's osc ucx does not make MPI_REPLACE
    // accumulates atomic with MPI_Compare_and_swap on the same word (docs/ROUTES.md, "Atomics").
    EXPECT_EQ(ctx.atomic_compare_swap(lock.data(), me, 0, 0), me) << "the lock was held by someone else";
  }
  ctx.barrier();
  if (ctx.rank() == 0) EXPECT_EQ(shared[0], static_cast<std::uint64_t>(ctx.size()) * kIters);
  ctx.finalize();
}

TEST(Rma, ZeroSizeAllocationsAndFree) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  auto empty = ctx.alloc<double>(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  ctx.put(empty.data(), nullptr, 0, (ctx.rank() + 1) % ctx.size());  // a no-op, still checks the rank
  auto a = ctx.alloc<int>(10);
  auto b = ctx.alloc<int>(10);
  const auto before = ctx.heap_free();
  a.free();
  auto c = ctx.alloc<int>(10);  // reuses a's block, same offset everywhere (checked by alloc)
  EXPECT_NE(c.data(), nullptr);
  empty.free();
  c.free();
  b.free();
  EXPECT_GE(ctx.heap_free(), before);
  ctx.finalize();
}

TEST(Rma, BadInputIsReportedWithRankCallAndValue) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int n = ctx.size();
  const std::string me = "rank " + std::to_string(ctx.rank());
  auto buf = ctx.alloc<std::uint64_t>(16);
  std::uint64_t local = 0;
  expect_error(Errc::out_of_range, [&] { ctx.put(buf.data(), &local, 8, n); },
               {me, "put", "target rank " + std::to_string(n)});
  expect_error(Errc::out_of_range, [&] { ctx.get(&local, buf.data(), 8, -1); }, {me, "get", "-1"});
  expect_error(Errc::out_of_range, [&] { ctx.put(buf.data() + 15, &local, 16, 0); },
               {"put", "runs past the end of its object"});
  expect_error(Errc::not_symmetric, [&] { ctx.put(&local, &local, 8, 0); }, {"put", "not in the symmetric heap"});
  expect_error(Errc::out_of_range, [&] { ctx.put_nbi(buf.data(), &local, std::size_t{1} << 62, 0); },
               {"put_nbi", "symmetric heap"});
  auto* misaligned = reinterpret_cast<std::uint64_t*>(reinterpret_cast<char*>(buf.data()) + 4);
  expect_error(Errc::misaligned, [&] { ctx.atomic_fetch_add(misaligned, 1, 0); },
               {me, "atomic_fetch_add", "8-byte aligned"});
  expect_error(Errc::misaligned, [&] { ctx.wait_until(misaligned, Cmp::eq, 0); }, {"wait_until", "aligned"});
  expect_error(Errc::overflow, [&] { (void)ctx.alloc<std::uint64_t>(std::size_t{1} << 62); }, {"alloc", "overflow"});
  try {
    (void)ctx.alloc<char>(std::size_t{1} << 30);
    ADD_FAILURE() << "a 1 GiB allocation in a 32 MiB heap succeeded";
  } catch (const OutOfHeap& e) {
    EXPECT_NE(std::string(e.what()).find("UBEP_HEAP_SIZE"), std::string::npos) << e.what();
  }
  // Nothing was lost: the heap still works after every error above.
  auto after = ctx.alloc<std::uint64_t>(4);
  ctx.put(after.data(), &local, 8, (ctx.rank() + 1) % n);
  ctx.quiet();
  buf.free();
  after.free();
  ctx.finalize();
  expect_error(Errc::finalized, [&] { ctx.put(nullptr, &local, 8, 0); }, {"put", "finalized"});
  expect_error(Errc::finalized, [&] { ctx.quiet(); }, {"quiet"});
  expect_error(Errc::finalized, [&] { (void)ctx.alloc<int>(1); }, {"alloc"});
}

// ptr(): a node peer's object mapped here (self, shm), null on the network routes; stores through it are
// puts that a later signal publishes. Every rank writes a row of every peer's `rows` (through ptr where it
// can, else put), signals, and every rank checks all rows.
TEST(Rma, PtrMapsNodePeersAndStoresArePublishedBySignals) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int n = ctx.size(), me = ctx.rank();
  constexpr std::size_t kRow = 100;  // 800 bytes: neither a cache line nor a page
  auto rows = ctx.alloc<std::uint64_t>(kRow * static_cast<std::size_t>(n));
  auto sig = ctx.alloc_signals(1);
  for (int round = 1; round <= 20; ++round) {
    int mapped = 0;
    for (int pe = 0; pe < n; ++pe) {
      std::uint64_t* row = rows.data() + kRow * static_cast<std::size_t>(me);
      std::uint64_t* there = ctx.ptr(row, kRow, pe);
      const Route r = ctx.route(pe);
      EXPECT_EQ(there != nullptr, r == Route::self || r == Route::shm) << "pe " << pe << " route " << to_string(r);
      std::vector<std::uint64_t> v(kRow);
      for (std::size_t i = 0; i < kRow; ++i) v[i] = (static_cast<std::uint64_t>(round) << 40) | (me << 20) | i;
      if (there) {
        std::copy(v.begin(), v.end(), there);  // plain stores into pe's copy
        ++mapped;
      } else {
        ctx.put(row, v.data(), kRow * 8, pe);
      }
      ctx.signal_op(sig.data(), 1, SignalOp::add, pe);  // ordered after the stores and the put
    }
    if (ctx.route(me) == Route::self) EXPECT_GE(mapped, 1);  // self, at least (UBEP_TRANSPORTS=mpi: none)
    ctx.wait_until(sig.data(), Cmp::ge, static_cast<std::uint64_t>(round) * n);
    for (int w = 0; w < n; ++w) {
      for (std::size_t i = 0; i < kRow; ++i) {
        const std::uint64_t want = (static_cast<std::uint64_t>(round) << 40) | (w << 20) | i;
        ASSERT_EQ(rows[kRow * w + i], want) << "round " << round << ", row of rank " << w << ", word " << i;
      }
    }
    ctx.barrier();  // nobody overwrites a row before every rank has checked it
  }
  // Checked like a put: the rank, the call and the bad value; nothing is lost.
  const std::string who = "rank " + std::to_string(me);
  std::uint64_t local = 0;
  expect_error(Errc::out_of_range, [&] { (void)ctx.ptr(rows.data(), 1, n); }, {who, "ptr", "target rank"});
  expect_error(Errc::out_of_range, [&] { (void)ctx.ptr(rows.data() + kRow * n - 1, 2, me); },
               {who, "ptr", "runs past the end of its object"});
  expect_error(Errc::out_of_range, [&] { (void)ctx.ptr(rows.data(), std::size_t{1} << 61, me); }, {"ptr"});
  expect_error(Errc::not_symmetric, [&] { (void)ctx.ptr(&local, 1, me); }, {"ptr", "not in the symmetric heap"});
  rows.free();
  sig.free();
  ctx.finalize();
  expect_error(Errc::finalized, [&] { (void)ctx.ptr(&local, 1, 0); }, {"ptr", "finalized"});
}

// The bounds check remembers the objects it saw last; a freed object must not stay valid in that memory,
// nor may a smaller object allocated in its place inherit its size.
TEST(Rma, FreedObjectsAreRejectedAfterRecentUse) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  const int me = ctx.rank(), peer = (me + 1) % ctx.size();
  std::uint64_t local[8] = {};
  auto keep = ctx.alloc<std::uint64_t>(8);
  auto big = ctx.alloc<std::uint64_t>(64);
  std::uint64_t* old = big.data();
  for (int i = 0; i < 3; ++i) {  // both objects in the check's memory
    ctx.put(old, local, sizeof local, peer);
    ctx.put(keep.data(), local, sizeof local, peer);
    ctx.get(local, old + 56, sizeof local, peer);
  }
  ctx.quiet();
  big.free();  // collective: every rank forgets it
  expect_error(Errc::out_of_range, [&] { ctx.put(old, local, 8, peer); },
               {"put", "not inside a live symmetric object"});
  expect_error(Errc::out_of_range, [&] { ctx.get(local, old + 56, 8, peer); }, {"get", "not inside a live"});
  auto small = ctx.alloc<std::uint64_t>(2);  // best fit: the first free slot, where `big` began
  ASSERT_EQ(small.data(), old);
  ctx.put(small.data(), local, 16, peer);
  expect_error(Errc::out_of_range, [&] { ctx.put(small.data(), local, 24, peer); }, {"put", "runs past the end"});
  expect_error(Errc::out_of_range, [&] { ctx.put(old + 56, local, 8, peer); }, {"put", "not inside a live"});
  ctx.quiet();
  small.free();
  keep.free();
  ctx.finalize();
}

TEST(Rma, MismatchedCollectivesAreDetected) {
  Context ctx(MPI_COMM_WORLD, small_heap());
  // Different sizes on different ranks.
  expect_error(Errc::collective_mismatch,
               [&] { (void)ctx.alloc<char>(64 + 64 * static_cast<std::size_t>(ctx.rank())); },
               {"alloc", "bytes ranges over"});
  // Different collectives at the same point.
  expect_error(Errc::collective_mismatch,
               [&] {
                 if (ctx.rank() == 0) {
                   ctx.barrier();
                 } else {
                   (void)ctx.alloc<char>(64);
                 }
               },
               {"collective mismatch"});
  // The heap lost nothing: a matching allocation works and gets the same offset everywhere.
  auto ok = ctx.alloc<char>(128);
  EXPECT_NE(ok.data(), nullptr);
  ok.free();
  ctx.finalize();
}

TEST(Rma, MismatchedHeapSizeIsDetected) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Options o = small_heap();
  o.heap_size = (16u << 20) + (static_cast<std::size_t>(rank) << 20);
  expect_error(Errc::collective_mismatch, [&] { Context ctx(MPI_COMM_WORLD, o); }, {"Context()", "UBEP_HEAP_SIZE"});
}

}  // namespace
}  // namespace ubep
