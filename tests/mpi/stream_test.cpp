// The stream-ordered calls (include/ubep/stream.hpp) from the outside, on every route and rank count:
//  - everywhere: bad arguments get the usual errors first (rank, range, alignment, writers); a peer not reached
//    by load/store gets Errc::unsupported naming its route; without a GPU every call says so with CUDA's answer
//    (in builds without kernels: that the build lacks them); an empty StreamWait and a finalized context throw;
//  - with a GPU (tests/gpu/check.sh): a GPU put_signal reaches a node peer's host heap (one kernel and the copy
//    engines, set and add), a stream waits for a CPU put_signal and then reads its data, and a stream wait that
//    is never satisfied ends at its deadline with a report; the first launch of a kernel while a wait spins
//    does not wait for that wait.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/mpi/test_util.hpp"
#include "ubep/config.hpp"
#include "ubep/ubep.hpp"

#if UBEP_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>
#endif

namespace ubep {
namespace {

bool gpu_everywhere() { return test::all_ranks(gpu_status().available); }

/// What a rank without the GPU path says, per build.
std::string no_gpu_reason() {
#if UBEP_HAVE_CUDA_KERNELS
  return "no usable GPU here: " + gpu_status().reason;
#elif UBEP_HAVE_CUDA
  return "built without nvcc";
#else
  return "built without CUDA";
#endif
}

TEST(StreamCalls, BadArgumentsAreReportedFirst) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
  auto data = ctx.alloc<std::uint64_t>(16);
  auto sig = ctx.alloc_signals(2);
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": ";
  GpuStream stream = nullptr;
  std::uint64_t outside = 0;
  test::expect_error(
      Errc::out_of_range,
      [&] { ctx.put_signal_on_stream(data.data(), &outside, 8, sig.data(), 1, SignalOp::set, ctx.size(), stream); },
      {me + "put_signal_on_stream: ", "target rank " + std::to_string(ctx.size())});
  test::expect_error(
      Errc::out_of_range,
      [&] { ctx.put_signal_on_stream(data.data() + 15, &outside, 16, sig.data(), 1, SignalOp::set, 0, stream); },
      {me + "put_signal_on_stream: "});
  test::expect_error(Errc::not_symmetric,
                     [&] { ctx.put_signal_on_stream(&outside, &outside, 8, sig.data(), 1, SignalOp::set, 0, stream); },
                     {me + "put_signal_on_stream: "});
  auto* misaligned = reinterpret_cast<std::uint64_t*>(reinterpret_cast<char*>(sig.data()) + 4);
  test::expect_error(Errc::misaligned, [&] { ctx.signal_op_on_stream(misaligned, 1, SignalOp::add, 0, stream); },
                     {me + "signal_op_on_stream: ", "not 8-byte aligned"});
  test::expect_error(Errc::misaligned, [&] { (void)ctx.wait_until_on_stream(misaligned, Cmp::ge, 1, stream); },
                     {me + "wait_until_on_stream: "});
  const int bad_writer = ctx.size() + 3;
  WaitOptions opts;
  opts.writers = std::span<const int>(&bad_writer, 1);
  test::expect_error(Errc::out_of_range, [&] { (void)ctx.wait_until_on_stream(sig.data(), Cmp::ge, 1, stream, opts); },
                     {me + "wait_until_on_stream: ", "WaitOptions::writers[0] = " + std::to_string(bad_writer)});
  ctx.finalize();
}

TEST(StreamCalls, WithoutTheGpuPathEveryCallSaysWhy) {
  if (gpu_everywhere()) GTEST_SKIP() << "a GPU on every rank: the GPU tests below run instead";
  Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
  auto data = ctx.alloc<std::uint64_t>(16);
  auto sig = ctx.alloc_signals(2);
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": ";
  const std::uint64_t v = 7;
  // stream.hpp: data and signals are load/store for self and shm peers unless atomics go through MPI.
  const bool signals_load_store = !ctx.atomics_through_mpi();
  const auto path_of = [&](int pe) {
    const bool mapped = ctx.route(pe) == Route::self || ctx.route(pe) == Route::shm;
    if (mapped && signals_load_store) return no_gpu_reason();
    return mapped ? "the signals to rank " + std::to_string(pe) + " go through MPI"
                  : "rank " + std::to_string(pe) + " is on the " + std::string(to_string(ctx.route(pe))) + " route";
  };
  for (int pe = 0; pe < ctx.size(); ++pe) {
    // Peers reached by load/store get as far as the GPU check; others are refused for their route first.
    const bool load_store = path_of(pe) == no_gpu_reason();
    const std::string why =
        load_store ? no_gpu_reason() : "stream-ordered calls reach peers by load/store only (route self or shm";
    test::expect_error(Errc::unsupported,
                       [&] { ctx.put_signal_on_stream(data.data(), &v, 8, sig.data(), 1, SignalOp::set, pe, nullptr); },
                       {me + "put_signal_on_stream: ", why});
    test::expect_error(Errc::unsupported, [&] { ctx.signal_op_on_stream(sig.data(), 1, SignalOp::add, pe, nullptr); },
                       {me + "signal_op_on_stream: ", why});
    if (!load_store) {
      test::expect_error(
          Errc::unsupported,
          [&] { ctx.put_signal_on_stream(data.data(), &v, 8, sig.data(), 1, SignalOp::set, pe, nullptr); },
          {path_of(pe)});
    }
  }
  test::expect_error(Errc::unsupported, [&] { (void)ctx.wait_until_on_stream(sig.data(), Cmp::ge, 1, nullptr); },
                     {me + "wait_until_on_stream: ", path_of(ctx.rank())});
  // Nothing was written anywhere: the data and the signals are as allocated.
  ctx.barrier();
  EXPECT_EQ(ctx.signal_fetch(sig.data()), 0u);
  ctx.finalize();
}

TEST(StreamCalls, EmptyAndFinalizedHandlesThrow) {
  StreamWait empty;
  test::expect_error(Errc::invalid_argument, [&] { (void)empty.done(); }, {"StreamWait::done(): an empty StreamWait"});
  test::expect_error(Errc::invalid_argument, [&] { (void)empty.result(); }, {"an empty StreamWait"});
  StreamWait moved(std::move(empty));
  test::expect_error(Errc::invalid_argument, [&] { (void)moved.done(); }, {"an empty StreamWait"});
  Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
  auto sig = ctx.alloc_signals(1);
  std::uint64_t* word = sig.data();
  ctx.finalize();
  test::expect_error(Errc::finalized, [&] { (void)ctx.wait_until_on_stream(word, Cmp::ge, 1, nullptr); },
                     {"wait_until_on_stream"});
  test::expect_error(Errc::finalized, [&] { ctx.signal_op_on_stream(word, 1, SignalOp::set, 0, nullptr); },
                     {"signal_op_on_stream"});
}

#if UBEP_HAVE_CUDA_KERNELS
#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// With a GPU on every rank and node peers reached by load/store (the default route on one node).
class GpuStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_everywhere()) GTEST_SKIP() << "no GPU: " << gpu_status().reason;
  }
};

TEST_F(GpuStreams, PutSignalFromAStreamReachesTheNodePeer) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(16u << 20));
  if (ctx.atomics_through_mpi() || ctx.node_ranks().size() != static_cast<std::size_t>(ctx.size())) {
    ctx.finalize();
    GTEST_SKIP() << "needs every rank on one node with load/store atomics";
  }
  constexpr std::size_t kBig = 1u << 20;  // through the copy engines; 4 KiB: one kernel
  auto data = ctx.alloc<unsigned char>(2 * kBig);
  auto sig = ctx.alloc_signals(4);
  const int to = (ctx.rank() + 1) % ctx.size(), from = (ctx.rank() + ctx.size() - 1) % ctx.size();
  std::vector<unsigned char> mine(kBig);
  for (std::size_t i = 0; i < kBig; ++i) mine[i] = test::pattern(ctx.rank(), i);
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, kBig));
  CUDA_OK(cudaMemcpy(dev, mine.data(), kBig, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ctx.barrier();
  ctx.put_signal_on_stream(data.data(), dev, 4096, sig.data(), 1, SignalOp::set, to, stream);
  ctx.put_signal_on_stream(data.data() + kBig, dev, kBig, sig.data() + 1, 5, SignalOp::add, to, stream);
  ctx.signal_op_on_stream(sig.data() + 1, 2, SignalOp::add, to, stream);
  ctx.wait_until(sig.data(), Cmp::eq, 1);
  ctx.wait_until(sig.data() + 1, Cmp::eq, 7);
  CUDA_OK(cudaStreamSynchronize(stream));
  bool ok = true;
  for (std::size_t i = 0; ok && i < kBig; ++i) {
    ok = data[kBig + i] == test::pattern(from, i) && (i >= 4096 || data[i] == test::pattern(from, i));
  }
  EXPECT_TRUE(ok) << "rank " << ctx.rank() << ": the data of rank " << from << " differs";
  ctx.barrier();
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(dev));
  ctx.finalize();
}

// The first stream calls of a context: a wait that spins on one stream, then the first launch of the put kernel
// on another stream, which satisfies it. CUDA loads kernels lazily by default, and loading one may wait for
// the kernels running (the spinning wait, until its deadline); ubep loads its kernels and allocates its wait
// slots when it sets the stream calls up, so the wait ends met, long before its deadline. Nothing is allocated
// or loaded by the test itself once the wait spins.
TEST_F(GpuStreams, FirstLaunchWhileAWaitSpinsDoesNotStall) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(16u << 20));
  if (ctx.atomics_through_mpi()) {
    ctx.finalize();
    GTEST_SKIP() << "needs load/store atomics";
  }
  auto data = ctx.alloc<std::uint64_t>(1);
  auto sig = ctx.alloc_signals(1);
  const std::uint64_t payload = 0x5eedu + static_cast<std::uint64_t>(ctx.rank());
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, sizeof payload));
  CUDA_OK(cudaMemcpy(dev, &payload, sizeof payload, cudaMemcpyHostToDevice));  // synchronous: done on return
  cudaStream_t waiting, putting;
  CUDA_OK(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&putting, cudaStreamNonBlocking));
  WaitOptions opts;
  opts.timeout = std::chrono::seconds(20);
  StreamWait w = ctx.wait_until_on_stream(sig.data(), Cmp::ge, 1, waiting, opts);  // sets the stream calls up
  ctx.put_signal_on_stream(data.data(), dev, sizeof payload, sig.data(), 1, SignalOp::set, ctx.rank(), putting);
  CUDA_OK(cudaStreamSynchronize(waiting));
  CUDA_OK(cudaStreamSynchronize(putting));
  ASSERT_TRUE(w.done());
  EXPECT_EQ(w.result(), 1u) << "rank " << ctx.rank();  // throws Errc::timeout if the put waited for the deadline
  EXPECT_EQ(data[0], payload) << "rank " << ctx.rank();
  ctx.barrier();
  CUDA_OK(cudaStreamDestroy(waiting));
  CUDA_OK(cudaStreamDestroy(putting));
  CUDA_OK(cudaFree(dev));
  ctx.finalize();
}

TEST_F(GpuStreams, StreamWaitsForACpuSignalAndItsDeadline) {
  Context ctx(MPI_COMM_WORLD, test::with_heap(16u << 20));
  if (ctx.atomics_through_mpi()) {
    ctx.finalize();
    GTEST_SKIP() << "needs load/store atomics";
  }
  constexpr std::size_t kBytes = 64 * 1024;
  auto data = ctx.alloc<unsigned char>(kBytes);
  auto sig = ctx.alloc_signals(2);
  const int from = (ctx.rank() + ctx.size() - 1) % ctx.size(), to = (ctx.rank() + 1) % ctx.size();
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, kBytes));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  WaitOptions opts;
  opts.timeout = std::chrono::seconds(20);
  StreamWait w = ctx.wait_until_on_stream(sig.data(), Cmp::ge, 3, stream, opts);
  CUDA_OK(cudaMemcpyAsync(dev, data.data(), kBytes, cudaMemcpyDefault, stream));  // after the wait
  ctx.barrier();
  std::vector<unsigned char> mine(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) mine[i] = test::pattern(ctx.rank(), i, 3);
  ctx.put_signal(data.data(), mine.data(), kBytes, sig.data(), 3, SignalOp::set, to);
  CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_TRUE(w.done());
  EXPECT_EQ(w.result(), 3u);
  std::vector<unsigned char> back(kBytes);
  CUDA_OK(cudaMemcpy(back.data(), dev, kBytes, cudaMemcpyDeviceToHost));
  bool ok = true;
  for (std::size_t i = 0; ok && i < kBytes; ++i) ok = back[i] == test::pattern(from, i, 3);
  EXPECT_TRUE(ok) << "the stream read the data before the signal's put";

  // Never satisfied: the stream goes on at the deadline, result() reports it.
  opts.timeout = std::chrono::milliseconds(50);
  const int writer = from;
  opts.writers = std::span<const int>(&writer, 1);
  StreamWait late = ctx.wait_until_on_stream(sig.data() + 1, Cmp::eq, 99, stream, opts);
  CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_TRUE(late.done());
  test::expect_error(Errc::timeout, [&] { (void)late.result(); },
                     {"rank " + std::to_string(ctx.rank()) + ": StreamWait::result: timeout after", "waiting for == 99",
                      "expected writer: rank " + std::to_string(from)});
  ctx.barrier();
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(dev));
  ctx.finalize();
}
#endif

}  // namespace
}  // namespace ubep
