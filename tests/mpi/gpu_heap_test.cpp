// The symmetric GPU heap (Context::alloc_device, README "GPUs") from the outside, on every route and rank count:
//  - everywhere: the argument errors of alloc come first; without a GPU (or without CUDA in the build) every rank
//    throws Errc::unsupported together, naming itself and CUDA's answer or the first rank without one, and the
//    context stays usable for host memory (a second alloc_device fails the same way, nothing hangs);
//    info() says the heap is not created and how GPU data would reach each peer; UBEP_GPU_HEAP_SIZE must agree;
//  - with a GPU (tests/gpu/check.sh): put, get, put_nbi + quiet, put_signal and ptr() between the ranks of a node
//    (2 processes on one GPU share it through CUDA IPC), data checked with cudaMemcpy; argument errors on GPU
//    addresses; a peer of another node (emulated nodes) refused; free and OutOfHeap naming UBEP_GPU_HEAP_SIZE.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/mpi/test_util.hpp"
#include "ubep/config.hpp"
#include "ubep/ubep.hpp"

#if UBEP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ubep {
namespace {

bool gpu_everywhere() { return test::all_ranks(gpu_status().available); }

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
    const std::string want = pe == ctx.rank() ? "self" : on_node(ctx, pe) ? "CUDA IPC" : "none: another node";
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

#if UBEP_HAVE_CUDA
#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

class GpuHeapWithGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_everywhere()) GTEST_SKIP() << "no GPU: " << gpu_status().reason;
  }
};

std::vector<std::uint32_t> values(int rank, std::size_t n, unsigned salt) {
  std::vector<std::uint32_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::uint32_t>(rank) * 1000003u + static_cast<std::uint32_t>(i) * 7u + salt;
  return v;
}

TEST_F(GpuHeapWithGpu, PutGetAndSignalsBetweenTheRanksOfANode) {
  Options o = test::with_heap(4u << 20);
  o.gpu_heap_size = 64u << 20;
  Context ctx(MPI_COMM_WORLD, o);
  constexpr std::size_t kN = 1u << 18;  // 1 MiB of uint32
  auto buf = ctx.alloc_device<std::uint32_t>(2 * kN);
  auto sig = ctx.alloc_signals(1);
  const RuntimeInfo info = ctx.info();
  EXPECT_NE(info.gpu_heap.find("bytes on CUDA device"), std::string::npos) << info.gpu_heap;
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
  CUDA_OK(cudaMemcpy(back.data(), buf.data(), back.size() * 4, cudaMemcpyDeviceToHost));
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
  // put_nbi + quiet, then ptr(): the peer's heap as mapped here.
  const std::vector<std::uint32_t> second = values(ctx.rank(), kN, 2);
  ctx.put_nbi(buf.data() + kN, second.data(), kN * 4, to);
  ctx.quiet();
  ctx.barrier();
  CUDA_OK(cudaMemcpy(back.data(), buf.data() + kN, kN * 4, cudaMemcpyDeviceToHost));
  const std::vector<std::uint32_t> their_second = values(from, kN, 2);
  EXPECT_TRUE(std::equal(their_second.begin(), their_second.end(), back.begin())) << "put_nbi from rank " << from;
  void* peer = ctx.ptr(buf.data(), 4, to);
  ASSERT_NE(peer, nullptr);
  std::uint32_t first = 0;
  CUDA_OK(cudaMemcpy(&first, peer, 4, cudaMemcpyDefault));
  EXPECT_EQ(first, mine[0]);
  // Errors on GPU addresses: past the object, an atomic on a GPU word.
  test::expect_error(Errc::out_of_range, [&] { ctx.put(buf.data() + 2 * kN - 1, mine.data(), 8, to); },
                     {"rank " + std::to_string(ctx.rank()) + ": put: ", "runs past the end of its object"});
  test::expect_error(Errc::not_symmetric, [&] { ctx.atomic_add(reinterpret_cast<std::uint64_t*>(buf.data()), 1, to); },
                     {"atomic_add: ", "is in the symmetric GPU heap"});
  ctx.barrier();
  ctx.finalize();
}

TEST_F(GpuHeapWithGpu, FreeReuseAndOutOfHeap) {
  Options o = test::with_heap(4u << 20);
  o.gpu_heap_size = 8u << 20;
  Context ctx(MPI_COMM_WORLD, o);
  auto a = ctx.alloc_device<char>(1u << 20);
  char* where = a.data();
  a.free();
  auto b = ctx.alloc_device<char>(1u << 20);
  EXPECT_EQ(b.data(), where);
  try {
    (void)ctx.alloc_device<char>(std::size_t{1} << 30);
    ADD_FAILURE() << "1 GiB fit in an 8 MiB GPU heap";
  } catch (const OutOfHeap& e) {
    EXPECT_NE(std::string(e.what()).find("UBEP_GPU_HEAP_SIZE"), std::string::npos) << e.what();
  }
  ctx.finalize();
}

TEST_F(GpuHeapWithGpu, PeersOfAnotherNodeAreRefused) {
  Options o = test::with_heap(4u << 20);
  o.gpu_heap_size = 8u << 20;
  Context ctx(MPI_COMM_WORLD, o);
  auto buf = ctx.alloc_device<std::uint64_t>(16);
  const std::uint64_t v = 1;
  for (int pe = 0; pe < ctx.size(); ++pe) {
    if (on_node(ctx, pe)) continue;
    test::expect_error(Errc::unsupported, [&] { ctx.put(buf.data(), &v, 8, pe); },
                       {"rank " + std::to_string(ctx.rank()) + ": put: ", "is on another node"});
    EXPECT_EQ(ctx.ptr(buf.data(), 8, pe), nullptr);
  }
  ctx.finalize();
}
#endif

}  // namespace
}  // namespace ubep
