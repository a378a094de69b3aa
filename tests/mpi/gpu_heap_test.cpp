// The symmetric GPU heap (Context::alloc_device, docs/GPU.md "GPUs") from the outside, on every route and rank count:
//  - everywhere: the argument errors of alloc come first; without a GPU (or without CUDA in the build) every rank
//    throws Errc::unsupported together, naming itself and CUDA's answer or the first rank without one, and the
//    context stays usable for host memory (a second alloc_device fails the same way, nothing hangs);
//    info() says the heap is not created and how GPU data would reach each peer; UBEP_GPU_HEAP_SIZE must agree;
//  - on a heap emulated in host memory (UBEP_GPU_EMULATE, every run) and on a GPU (tests/gpu/check.sh): put, get,
//    the nbi calls + quiet, put_signal GPU to GPU and ptr() between the ranks of a node (2 processes on one GPU
//    share it through CUDA IPC), data checked outside ubep (cudaMemcpy, memcpy); argument errors on GPU
//    addresses; free, reuse, a host/GPU free mismatch and OutOfHeap; puts to every rank of the other (emulated)
//    nodes through the staged route, from host and from GPU memory, many chunks each, and gets from them into host
//    and GPU memory, more in flight than the route's ring of requests holds; a deadline for both;
//    Context::copy between host memory and the GPU heap.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/mpi/gpu_heap_fixture.hpp"
#include "tests/mpi/test_util.hpp"
#include "ubep/config.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

using test::gpu_everywhere;

bool on_node(const Context& ctx, int pe) {
  const auto r = ctx.node_ranks();
  return std::find(r.begin(), r.end(), pe) != r.end();
}

TEST(GpuHeap, ArgumentErrorsComeFirst) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": alloc_device: ";
  test::expect_error(Errc::overflow, [&] { (void)ctx.alloc_device<std::uint64_t>(std::size_t{1} << 62); },
                     {me, "overflow the size computation"});
  struct alignas(8192) Huge {
    char c;
  };
  test::expect_error(Errc::invalid_argument, [&] { (void)ctx.alloc_device<Huge>(1); }, {me, "alignment 8192"});
  ctx.finalize();
  test::expect_error(Errc::finalized, [&] { (void)ctx.alloc_device<float>(4); }, {"alloc_device"});
}

TEST(GpuHeap, InfoSaysHowGpuDataReachesEachPeer) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
  const RuntimeInfo info = ctx.info();
  EXPECT_NE(info.gpu_heap.find("not created"), std::string::npos) << info.gpu_heap;
  EXPECT_NE(info.gpu_heap.find("UBEP_GPU_HEAP_SIZE=" + std::to_string(ctx.options().gpu_heap_size)), std::string::npos)
      << info.gpu_heap;
  ASSERT_EQ(info.gpu_peers.size(), static_cast<std::size_t>(ctx.size()));
  for (int pe = 0; pe < ctx.size(); ++pe) {
    const std::string& p = info.gpu_peers[pe];
    const std::string want = pe == ctx.rank() ? "self" : on_node(ctx, pe) ? "CUDA IPC" : "staged: another node";
    EXPECT_EQ(p.rfind(want, 0), 0u) << "rank " << ctx.rank() << " to " << pe << ": " << p;
  }
  ctx.finalize();
}

TEST(GpuHeap, SizeMustAgree) {
  Options o = test::with_heap(4u << 20);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  o.gpu_heap_size = rank == 0 ? (std::size_t{64} << 20) : (std::size_t{32} << 20);
  test::expect_error(Errc::collective_mismatch, [&] { Context ctx(MPI_COMM_WORLD, o); }, {"UBEP_GPU_HEAP_SIZE"});
}

TEST(GpuHeap, WithoutAGpuEveryRankFailsTogether) {
  if (gpu_everywhere()) GTEST_SKIP() << "a GPU on every rank: the GPU tests below run instead";
  Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": alloc_device: ";
#if UBEP_HAVE_CUDA
  // This rank names CUDA's answer when it has no GPU; a rank with one names the first rank without.
  const std::string why = gpu_status().available ? "could not find a usable GPU" : "no usable GPU here: no GPU";
#else
  const std::string why = "built without CUDA";
#endif
  for (int round = 0; round < 2; ++round) {  // a retry is collective again and fails the same way
    test::expect_error(Errc::unsupported, [&] { (void)ctx.alloc_device<float>(1024); }, {me, why});
  }
  EXPECT_NE(ctx.info().gpu_heap.find("not created"), std::string::npos);
  // The host heap is untouched: a put around the ring and a barrier still work.
  auto data = ctx.alloc<std::uint64_t>(1);
  const std::uint64_t v = 100 + static_cast<std::uint64_t>(ctx.rank());
  ctx.put(data.data(), &v, sizeof v, (ctx.rank() + 1) % ctx.size());
  ctx.barrier();
  EXPECT_EQ(data[0], 100u + static_cast<std::uint64_t>((ctx.rank() + ctx.size() - 1) % ctx.size()));
  ctx.finalize();
}

// The calls on GPU addresses, twice: on a heap EMULATED in host memory and on a real GPU (gpu_heap_fixture.hpp).
using test::Heap;

class GpuHeapCalls : public test::GpuHeapFixture {
 protected:
  Options options(std::size_t gpu_heap_bytes) const { return with_gpu_heap(test::with_heap(4u << 20), gpu_heap_bytes); }
  /// The staged route to other nodes even where MPI is CUDA-aware, in chunks of 64 KiB.
  Options staged_options() const {
    Options o = options(16u << 20);
    o.gpu_staging_chunk = 64u << 10;
    o.gpu_mpi_window = ubep::GpuMpiWindow::off;
    return o;
  }
};

/// True, after finalizing ctx, when every rank is on one node (the same answer on every rank): the tests of other
/// nodes skip then.
bool one_node(Context& ctx) {
  if (static_cast<int>(ctx.node_ranks().size()) != ctx.size()) return false;
  ctx.finalize();
  return true;
}

std::vector<std::uint32_t> values(int rank, std::size_t n, unsigned salt) {
  std::vector<std::uint32_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::uint32_t>(rank) * 1000003u + static_cast<std::uint32_t>(i) * 7u + salt;
  return v;
}

/// Rank 0's first peer on another node, the same on every rank (each rank knows only its own node's ranks).
int first_far_rank_of_rank0(const Context& ctx) {
  int target = 0;
  while (target < ctx.size() && on_node(ctx, target)) ++target;
  EXPECT_EQ(MPI_Bcast(&target, 1, MPI_INT, 0, MPI_COMM_WORLD), MPI_SUCCESS);
  return target;
}

/// The ranks of other nodes than this rank's.
std::vector<int> far_ranks(const Context& ctx) {
  std::vector<int> far;
  for (int pe = 0; pe < ctx.size(); ++pe) {
    if (!on_node(ctx, pe)) far.push_back(pe);
  }
  return far;
}

/// Every rank to every rank of `far`, into its own part (n words at rank * n) of `buf` in the GPU heap: put_signal
/// from host memory (values salted `salt`), the signal after the data; then put_nbi from its GPU heap itself
/// (salt + 1) completed by quiet(). Each target checks what arrived through `copy` (a copy outside ubep).
template <class Copy>
void puts_to_far_ranks(Context& ctx, std::uint32_t* buf, std::uint64_t* sig, std::size_t n, const std::vector<int>& far,
                       unsigned salt, Copy copy) {
  const int me = ctx.rank();
  std::uint32_t* part = buf + static_cast<std::size_t>(me) * n;
  const std::vector<std::uint32_t> first = values(me, n, salt);
  for (int pe : far) ctx.put_signal(part, first.data(), n * 4, sig + me, 1, SignalOp::set, pe);
  std::vector<std::uint32_t> back(n);
  for (int from : far) {
    ctx.wait_until(sig + from, Cmp::eq, 1);
    copy(back.data(), buf + static_cast<std::size_t>(from) * n, n * 4);
    EXPECT_EQ(back, values(from, n, salt)) << "put_signal from rank " << from << " to rank " << me;
  }
  ctx.barrier();
  const std::vector<std::uint32_t> second = values(me, n, salt + 1);
  ctx.put(part, second.data(), n * 4, me);
  for (int pe : far) ctx.put_nbi(part, part, n * 4, pe);
  ctx.quiet();
  ctx.barrier();
  for (int from : far) {
    copy(back.data(), buf + static_cast<std::size_t>(from) * n, n * 4);
    EXPECT_EQ(back, values(from, n, salt + 1)) << "put_nbi from rank " << from << " to rank " << me;
  }
}

/// This rank gets every far rank's own part of `buf` (what puts_to_far_ranks left there with salt - 1): get into
/// host memory (complete on return), get_nbi into host memory and into `scratch` (n words of this rank's GPU heap)
/// completed by quiet(), and the part in 6 slices by get_nbi, more gets in flight to one rank than the staged
/// route's ring of requests holds. `copy` reads the GPU heap outside ubep.
template <class Copy>
void gets_from_far_ranks(Context& ctx, const std::uint32_t* buf, std::uint32_t* scratch, std::size_t n,
                         const std::vector<int>& far, unsigned salt, Copy copy) {
  const int me = ctx.rank();
  for (int pe : far) {
    const std::uint32_t* theirs = buf + static_cast<std::size_t>(pe) * n;
    const std::vector<std::uint32_t> want = values(pe, n, salt);
    std::vector<std::uint32_t> back(n, 0), later(n, 0), sliced(n, 0);
    ctx.get(back.data(), theirs, n * 4, pe);
    EXPECT_EQ(back, want) << "get by rank " << me << " from rank " << pe;
    ctx.get_nbi(later.data(), theirs, n * 4, pe);
    ctx.get_nbi(scratch, theirs, n * 4, pe);
    const std::size_t slice = (n + 5) / 6;
    for (std::size_t at = 0; at < n; at += slice)
      ctx.get_nbi(sliced.data() + at, theirs + at, std::min(slice, n - at) * 4, pe);
    ctx.quiet();
    EXPECT_EQ(later, want) << "get_nbi by rank " << me << " from rank " << pe;
    EXPECT_EQ(sliced, want) << "6 get_nbi slices by rank " << me << " from rank " << pe;
    copy(back.data(), scratch, n * 4);
    EXPECT_EQ(back, want) << "get_nbi into the GPU heap by rank " << me << " from rank " << pe;
    EXPECT_EQ(ctx.ptr(theirs, 4, pe), nullptr);
  }
  ctx.barrier();  // no rank leaves while a peer still needs it to serve its gets
}

/// `o` with UBEP_PROGRESS_THREAD=1 and a 30 s deadline (the tests where a target computes outside ubep). The thread
/// calls MPI every 1 ms, not every 50 us: 4 ranks on 2 cores, each thread waking 20000 times a second into an
/// MPI_Iprobe that yields, made the whole machine stall for seconds (up to 50 s measured under 2 CPU hogs, 10 runs
/// in 40 slow; docs/MULTINODE.md "Known problems"). The tests check that the thread drives completion, not how soon.
Options with_progress_thread(Options o) {
  o.progress_thread = ProgressThread::on;
  o.progress_interval_us = 1000;
  o.wait_timeout = std::chrono::seconds(30);
  return o;
}

/// The emulated GPU heap with the window route forced (UBEP_GPU_MPI_WINDOW=1).
Options window_options() {
  Options o = test::with_heap(4u << 20);
  o.gpu_heap_size = 16u << 20;
  o.gpu_emulate = true;
  o.gpu_mpi_window = ubep::GpuMpiWindow::on;
  return o;
}

TEST_P(GpuHeapCalls, PutGetAndSignalsBetweenTheRanksOfANode) {
  Context ctx(MPI_COMM_WORLD, options(64u << 20));
  constexpr std::size_t kN = 1u << 18;  // 1 MiB of uint32
  auto buf = ctx.alloc_device<std::uint32_t>(2 * kN);
  auto sig = ctx.alloc_signals(1);
  const RuntimeInfo info = ctx.info();
  EXPECT_NE(info.gpu_heap.find(GetParam() == Heap::emulated ? "EMULATING a GPU" : "bytes on CUDA device"),
            std::string::npos)
      << info.gpu_heap;
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf.data()) % 256, 0u);
  const auto nodes = ctx.node_ranks();
  const int pos = static_cast<int>(std::find(nodes.begin(), nodes.end(), ctx.rank()) - nodes.begin());
  const int n = static_cast<int>(nodes.size());
  const int to = nodes[(pos + 1) % n], from = nodes[(pos + n - 1) % n];
  // Blocking put from host memory into the next node rank's GPU heap; put_signal of device memory after it.
  const std::vector<std::uint32_t> mine = values(ctx.rank(), kN, 1);
  ctx.put(buf.data(), mine.data(), kN * 4, to);
  ctx.barrier();  // every first half now holds the predecessor's values
  ctx.put_signal(buf.data() + kN, buf.data(), kN * 4, sig.data(), 1, SignalOp::add, to);  // GPU to GPU
  ctx.wait_until(sig.data(), Cmp::ge, 1);
  std::vector<std::uint32_t> back(2 * kN);
  copy_raw(back.data(), buf.data(), back.size() * 4);
  const std::vector<std::uint32_t> theirs = values(from, kN, 1);
  EXPECT_TRUE(std::equal(theirs.begin(), theirs.end(), back.begin())) << "put from rank " << from;
  // The second half is `from`'s first half: the values of `from`'s predecessor.
  const std::vector<std::uint32_t> relayed = values(nodes[(pos + 2 * n - 2) % n], kN, 1);
  EXPECT_TRUE(std::equal(relayed.begin(), relayed.end(), back.begin() + kN)) << "put_signal from rank " << from;
  ctx.barrier();
  // get: the next rank's first half (what this rank put there) into host memory.
  std::vector<std::uint32_t> got(kN);
  ctx.get(got.data(), buf.data(), kN * 4, to);
  EXPECT_EQ(got, mine);
  // put_nbi, put_signal_nbi and get_nbi, completed by quiet().
  const std::vector<std::uint32_t> second = values(ctx.rank(), kN, 2);
  ctx.put_nbi(buf.data() + kN, second.data(), kN * 4, to);
  ctx.put_signal_nbi(buf.data() + kN / 2, second.data(), 64, sig.data(), 1, SignalOp::add, to);
  ctx.quiet();
  ctx.wait_until(sig.data(), Cmp::ge, 2);
  ctx.barrier();
  copy_raw(back.data(), buf.data(), 2 * kN * 4);
  const std::vector<std::uint32_t> their_second = values(from, kN, 2);
  EXPECT_TRUE(std::equal(their_second.begin(), their_second.end(), back.begin() + kN)) << "put_nbi from " << from;
  EXPECT_TRUE(std::equal(their_second.begin(), their_second.begin() + 16, back.begin() + kN / 2))
      << "put_signal_nbi from rank " << from;
  std::vector<std::uint32_t> got2(kN, 0);
  ctx.get_nbi(got2.data(), buf.data() + kN, kN * 4, to);
  ctx.quiet();
  EXPECT_EQ(got2, second);
  // ptr(): the peer's heap as mapped here.
  void* peer = ctx.ptr(buf.data(), 4, to);
  ASSERT_NE(peer, nullptr);
  std::uint32_t first = 0;
  copy_raw(&first, peer, 4);
  EXPECT_EQ(first, mine[0]);
  // Errors on GPU addresses: past the object, an atomic or a signal word in the GPU heap, an unknown pointer.
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": ";
  test::expect_error(Errc::out_of_range, [&] { ctx.put(buf.data() + 2 * kN - 1, mine.data(), 8, to); },
                     {me + "put: ", "runs past the end of its object"});
  test::expect_error(Errc::out_of_range, [&] { ctx.get(got.data(), buf.data() + 2 * kN - 1, 8, to); },
                     {me + "get: ", "runs past the end of its object"});
  auto* word = reinterpret_cast<std::uint64_t*>(buf.data());
  test::expect_error(Errc::not_symmetric, [&] { ctx.atomic_add(word, 1, to); },
                     {me + "atomic_add: ", "is in the symmetric GPU heap"});
  test::expect_error(Errc::not_symmetric, [&] { ctx.signal_op(word, 1, SignalOp::set, to); },
                     {me + "signal_op: ", "is in the symmetric GPU heap"});
  test::expect_error(Errc::out_of_range, [&] { ctx.put(buf.data(), mine.data(), 4, ctx.size()); },
                     {me + "put: ", "target rank " + std::to_string(ctx.size())});
  ctx.barrier();
  ctx.finalize();
}

TEST_P(GpuHeapCalls, FreeReuseAndOutOfHeap) {
  Context ctx(MPI_COMM_WORLD, options(8u << 20));
  auto a = ctx.alloc_device<char>(1u << 20);
  char* where = a.data();
  a.free();
  auto b = ctx.alloc_device<char>(1u << 20);
  EXPECT_EQ(b.data(), where);
  {
    auto c = ctx.alloc_device<char>(1u << 20);  // released locally by its destructor
    EXPECT_NE(c.data(), where);
  }
  auto d = ctx.alloc_device<char>(1u << 20);  // the next allocation takes its place again
  EXPECT_EQ(d.data(), where + (1u << 20));
  try {
    (void)ctx.alloc_device<char>(std::size_t{1} << 30);
    ADD_FAILURE() << "1 GiB fit in an 8 MiB GPU heap";
  } catch (const OutOfHeap& e) {
    EXPECT_NE(std::string(e.what()).find("UBEP_GPU_HEAP_SIZE"), std::string::npos) << e.what();
  }
  // A host object and a GPU object freed by different ranks in one call are a mismatch, not a free.
  auto host = ctx.alloc<char>(64);
  if (ctx.size() > 1) {
    try {
      if (ctx.rank() == 0) {
        host.free();
      } else {
        b.free();
      }
      ADD_FAILURE() << "ranks freed a host and a GPU object in one call";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::collective_mismatch) << e.what();
    }
  }
  ctx.finalize();
}

// Context::copy: host <-> GPU heap <-> host in both directions, and within the GPU heap; before the GPU heap
// exists it copies host memory; null pointers and use after finalize are refused.
TEST_P(GpuHeapCalls, CopyMovesBetweenAnyMemories) {
  Context ctx(MPI_COMM_WORLD, options(8u << 20));
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": copy: ";
  const std::vector<std::uint32_t> want = values(ctx.rank(), 1000, 5);
  std::vector<std::uint32_t> host(want.size(), 0);
  ctx.copy(host.data(), want.data(), want.size() * 4);  // no GPU heap yet: a memcpy
  EXPECT_EQ(host, want);
  ctx.copy(host.data(), nullptr, 0);  // nothing to copy: no check
  test::expect_error(Errc::invalid_argument, [&] { ctx.copy(host.data(), nullptr, 4); },
                     {me, "src is null", "4 bytes"});
  test::expect_error(Errc::invalid_argument, [&] { ctx.copy(nullptr, host.data(), 8); }, {me, "dst is null"});
  auto dev = ctx.alloc_device<std::uint32_t>(2 * want.size());
  ctx.copy(dev.data(), want.data(), want.size() * 4);               // host -> GPU
  ctx.copy(dev.data() + want.size(), dev.data(), want.size() * 4);  // GPU -> GPU
  std::vector<std::uint32_t> raw(want.size(), 0), back(want.size(), 0);
  copy_raw(raw.data(), dev.data() + want.size(), want.size() * 4);  // checked outside ubep
  EXPECT_EQ(raw, want) << "rank " << ctx.rank();
  ctx.copy(back.data(), dev.data() + want.size(), want.size() * 4);  // GPU -> host
  EXPECT_EQ(back, want) << "rank " << ctx.rank();
  ctx.finalize();
  test::expect_error(Errc::finalized, [&] { ctx.copy(back.data(), want.data(), 4); }, {"copy"});
}

TEST_P(GpuHeapCalls, TheStagedRouteCarriesPutsAndGetsToOtherNodes) {
  Options o = staged_options();
  Context ctx(MPI_COMM_WORLD, o);
  const int p = ctx.size();
  constexpr std::size_t kN = 100000;  // 400000 bytes: 6 chunks and a part, more than the 2 slots in flight
  auto buf = ctx.alloc_device<std::uint32_t>(kN * static_cast<std::size_t>(p));  // part r: what rank r sends
  auto scratch = ctx.alloc_device<std::uint32_t>(kN);
  auto sig = ctx.alloc_signals(static_cast<std::size_t>(p));
  const std::vector<int> far = far_ranks(ctx);
  const RuntimeInfo info = ctx.info();
  for (int pe : far) EXPECT_EQ(info.gpu_peers[pe].rfind("staged: another node", 0), 0u) << info.gpu_peers[pe];
  const auto raw = [&](void* d, const void* src, std::size_t b) { copy_raw(d, src, b); };
  // Every rank to every rank of the other nodes at once: each serves the others' chunks while it waits for its
  // own credits; put_nbi from the GPU heap goes device -> host -> wire -> host -> device.
  puts_to_far_ranks(ctx, buf.data(), sig.data(), kN, far, 3, raw);
  // Gets the other way, every rank from every far rank at once: each serves the others' requests while it waits.
  gets_from_far_ranks(ctx, buf.data(), scratch.data(), kN, far, 4, raw);
  ctx.finalize();
}

// UBEP_GPU_MPI_WINDOW=1 on the emulated heap: an MPI window over the GPU heap carries puts and gets to the ranks
// of other nodes (what a CUDA-aware MPI gets by default; Debian's MPIs are not, so it is forced here, on host
// memory standing in for the GPU's).
TEST(GpuHeap, TheMpiWindowCarriesPutsAndGetsToOtherNodes) {
  Context ctx(MPI_COMM_WORLD, window_options());
  const int p = ctx.size();
  const std::vector<int> far = far_ranks(ctx);
  if (far.empty()) {
    ctx.finalize();
    GTEST_SKIP() << "every rank on one node: no window (needs UBEP_VIRTUAL_NODES or several nodes)";
  }
  for (int pe : far) {
    const std::string path = ctx.info().gpu_peers[pe];
    EXPECT_EQ(path.rfind("MPI window: another node", 0), 0u) << path;
    EXPECT_NE(path.find("decided at the first alloc_device"), std::string::npos) << path;
  }
  constexpr std::size_t kN = 100000;
  auto buf = ctx.alloc_device<std::uint32_t>(kN * static_cast<std::size_t>(p));  // part r: what rank r sends
  auto scratch = ctx.alloc_device<std::uint32_t>(kN);
  auto sig = ctx.alloc_signals(static_cast<std::size_t>(p));
  for (int pe : far) {
    const std::string path = ctx.info().gpu_peers[pe];
    EXPECT_EQ(path, "MPI window: another node, MPI_Put/MPI_Get on a window over the GPU heap (UBEP_GPU_MPI_WINDOW=1)");
  }
  const auto host = [](void* d, const void* src, std::size_t b) { std::memcpy(d, src, b); };  // emulated: host
  puts_to_far_ranks(ctx, buf.data(), sig.data(), kN, far, 7, host);
  gets_from_far_ranks(ctx, buf.data(), scratch.data(), kN, far, 8, host);
  ctx.finalize();
}

// The window route with UBEP_PROGRESS_THREAD=1: a put to a rank of another node completes while that rank
// computes outside ubep and MPI (the thread's MPI calls progress the window where MPI needs the target's
// progress; Debian's Open MPI with UCX, on virtual and on netns-emulated nodes, lands it even without the thread,
// so here this holds the promise, it does not isolate the thread). The target watches its own GPU heap
// (emulated: host memory) with plain loads until the data is there.
TEST(GpuHeap, TheMpiWindowCompletesWhileTheTargetComputes) {
  Context ctx(MPI_COMM_WORLD, with_progress_thread(window_options()));
  if (one_node(ctx)) GTEST_SKIP() << "needs ranks on two nodes (UBEP_VIRTUAL_NODES)";
  constexpr std::size_t kN = 100000;
  auto buf = ctx.alloc_device<std::uint32_t>(kN);
  const int target = first_far_rank_of_rank0(ctx);
  const std::vector<std::uint32_t> data = values(0, kN, 9);
  ctx.barrier();
  if (ctx.rank() == 0) {
    ctx.put(buf.data(), data.data(), kN * 4, target);  // returns remotely complete: the target never called ubep
  } else if (ctx.rank() == target) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool there = false;
    while (!there && std::chrono::steady_clock::now() < deadline) {
      there = true;
      for (std::size_t i = 0; i < kN && there; ++i) {
        there = std::atomic_ref<std::uint32_t>(buf.data()[i]).load(std::memory_order_acquire) == data[i];
      }
      if (!there) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "computing": no MPI, no ubep
    }
    EXPECT_TRUE(there) << "rank " << target << ": rank 0's put did not land within 30 s while this rank computed";
  }
  ctx.barrier();
  ctx.finalize();
}

TEST_P(GpuHeapCalls, AStagedPutOrGetToATargetOutsideUbepEndsAtTheDeadline) {
  Options o = staged_options();
  o.wait_timeout = std::chrono::seconds(1);
  o.progress_thread = ProgressThread::off;  // UBEP_PROGRESS_THREAD=0: the target's thread is its only one
  Context ctx(MPI_COMM_WORLD, o);
  if (one_node(ctx)) GTEST_SKIP() << "needs ranks on two nodes (UBEP_VIRTUAL_NODES)";
  constexpr std::size_t kN = 100000;
  auto buf = ctx.alloc_device<std::uint32_t>(kN);
  const int target = first_far_rank_of_rank0(ctx);
  const std::vector<std::uint32_t> data = values(0, kN, 5);
  if (ctx.rank() == 0) {
    // The target sits in a plain MPI_Barrier (outside ubep) until this rank joins it: no credit comes back.
    test::expect_error(
        Errc::timeout, [&] { ctx.put(buf.data(), data.data(), kN * 4, target); },
        {"rank 0: put: ", "UBEP_WAIT_TIMEOUT", "to rank " + std::to_string(target) + ": ", "awaiting its credit"});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The target is back in ubep: the transfer that timed out completes at the next quiet().
  ctx.quiet();
  ctx.barrier();
  if (ctx.rank() == target) {
    std::vector<std::uint32_t> back(kN);
    copy_raw(back.data(), buf.data(), kN * 4);
    EXPECT_EQ(back, data);
  }
  // A get from a target outside ubep: nobody serves the request until the deadline; quiet() completes it later.
  std::vector<std::uint32_t> got(kN, 0);
  if (ctx.rank() == 0) {
    test::expect_error(Errc::timeout, [&] { ctx.get(got.data(), buf.data(), kN * 4, target); },
                       {"rank 0: get: ", "UBEP_WAIT_TIMEOUT",
                        "from rank " + std::to_string(target) + ": gets 1..1 awaiting their data"});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ctx.quiet();
  ctx.barrier();
  if (ctx.rank() == 0) EXPECT_EQ(got, data) << "the get that timed out, completed by quiet()";
  ctx.finalize();
}

// UBEP_PROGRESS_THREAD=1 on the staged route: where the ranks of other nodes are on the ucx route, the progress
// thread drives the route, so rank 0's put to a rank of another node, and its get from there, complete while that
// rank computes outside ubep and MPI (without the thread both end at the deadline: the test above). The target
// watches a signal word with plain atomic loads until rank 0, done, adds 1 to it; then it checks its GPU heap. Over
// the mpi route the thread leaves the route to the ranks' own ubep calls, and info() says which it is.
TEST_P(GpuHeapCalls, TheProgressThreadDrivesTheStagedRouteWhileTheTargetComputes) {
  Context ctx(MPI_COMM_WORLD, with_progress_thread(staged_options()));
  if (one_node(ctx)) GTEST_SKIP() << "needs ranks on two nodes (UBEP_VIRTUAL_NODES)";
  constexpr std::size_t kN = 100000;  // 400000 bytes: 7 chunks through 2 slots, so credits must come back
  auto buf = ctx.alloc_device<std::uint32_t>(2 * kN);  // [0, kN): rank 0's put; [kN, 2 kN): for its get
  auto done = ctx.alloc_signals(1);
  const int target = first_far_rank_of_rank0(ctx);
  bool ucx = true;
  for (int pe = 0; pe < ctx.size(); ++pe) ucx = ucx && (on_node(ctx, pe) || ctx.route(pe) == Route::ucx);
  const std::string path = ctx.info().gpu_peers[far_ranks(ctx).front()];
  const bool driven = path.find("the progress thread drives it") != std::string::npos;
  EXPECT_EQ(driven, ucx) << "rank " << ctx.rank() << ": " << path;
  if (!ucx) {  // every rank sees the same routes to other nodes
    ctx.finalize();
    return;
  }
  const std::vector<std::uint32_t> data = values(0, kN, 11), theirs = values(target, kN, 12);
  if (ctx.rank() == target) copy_raw(buf.data() + kN, theirs.data(), kN * 4);
  ctx.barrier();
  if (ctx.rank() == 0) {
    ctx.put(buf.data(), data.data(), kN * 4, target);  // returns when every chunk is on the target's GPU heap
    std::vector<std::uint32_t> got(kN, 0);
    ctx.get(got.data(), buf.data() + kN, kN * 4, target);  // served by the target's progress thread
    EXPECT_EQ(got, theirs) << "rank 0's get from rank " << target << ", which computed meanwhile";
    ctx.signal_op(done.data(), 1, SignalOp::add, target);
  } else if (ctx.rank() == target) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::uint64_t seen = 0;
    while (seen == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "computing": no MPI, no ubep
      seen = std::atomic_ref<std::uint64_t>(done[0]).load(std::memory_order_acquire);
    }
    EXPECT_EQ(seen, 1u) << "rank " << target << ": rank 0's calls did not complete within 30 s while this rank "
                        << "computed";
    std::vector<std::uint32_t> back(kN);
    copy_raw(back.data(), buf.data(), kN * 4);
    EXPECT_EQ(back, data) << "rank 0's put to rank " << target;
  }
  ctx.barrier();
  ctx.finalize();
}

TEST_P(GpuHeapCalls, StagingBuffersThatDoNotFitLeaveNoHeapBehind) {
  Options o = options(8u << 20);
  o.gpu_staging_chunk = 4u << 20;  // 4 chunks per rank: more than the 4 MiB host heap
  Context ctx(MPI_COMM_WORLD, o);
  if (static_cast<int>(ctx.node_ranks().size()) == ctx.size()) {  // one node: no staged route, no buffers
    auto buf = ctx.alloc_device<char>(64);
    EXPECT_NE(buf.data(), nullptr);
    ctx.finalize();
    return;
  }
  for (int round = 0; round < 2; ++round) {  // a retry fails the same way, on every rank
    try {
      (void)ctx.alloc_device<char>(64);
      ADD_FAILURE() << "the staging buffers fit in a 4 MiB host heap";
    } catch (const OutOfHeap& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("staged route's host buffers"), std::string::npos) << what;
      EXPECT_NE(what.find("set UBEP_HEAP_SIZE to at least"), std::string::npos) << what;
    }
    EXPECT_NE(ctx.info().gpu_heap.find("not created"), std::string::npos) << ctx.info().gpu_heap;
  }
  auto host = ctx.alloc<char>(1u << 20);  // the host heap holds nothing of the failed attempts
  EXPECT_NE(host.data(), nullptr);
  ctx.finalize();
}

INSTANTIATE_TEST_SUITE_P(Heaps, GpuHeapCalls, ::testing::Values(Heap::emulated, Heap::cuda), test::heap_name);

}  // namespace
}  // namespace ubep
