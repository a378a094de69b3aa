// gpu.kernels_check (label gpu): the stream-ordered signal kernels of transports/cuda/ on a real GPU, one process.
// Without a GPU it exits 77 (CTest: skipped) with the reason; UBEP_REQUIRE_GPU=1 makes that a failure.
//  - put_signal_async copies every size from 0 B to 1 MiB (aligned and misaligned ends) and a wait on another
//    stream, ordered behind the signal, sees all of it;
//  - adds accumulate; a set after adds wins;
//  - a signal written by the GPU into mapped host memory is acquired by the CPU with the data before it;
//  - a CPU release store into mapped host memory releases a waiting stream;
//  - a wait that is never satisfied ends at its deadline with timed_out and the value it saw, and the stream
//    goes on.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/gpu/require_gpu.hpp"
#include "transports/cuda/signal_kernels.hpp"
#include "ubep/gpu.hpp"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
  failures += ok ? 0 : 1;
}

#define CUDA_OK(call)                                                                                        \
  do {                                                                                                       \
    const cudaError_t rc_ = (call);                                                                          \
    if (rc_ != cudaSuccess) {                                                                                \
      std::printf("FAIL: %s: %s\n", #call, ubep::detail::cuda::error_string(static_cast<int>(rc_)).c_str()); \
      std::exit(1);                                                                                          \
    }                                                                                                        \
  } while (0)

#define LAUNCH_OK(call)                                                                    \
  do {                                                                                     \
    const int rc_ = (call);                                                                \
    if (rc_ != 0) {                                                                        \
      std::printf("FAIL: %s: %s\n", #call, ubep::detail::cuda::error_string(rc_).c_str()); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using ubep::Cmp;
using ubep::SignalOp;
using ubep::detail::cuda::StreamWaitStatus;
namespace k = ubep::detail::cuda;

std::uint64_t host_acquire(const std::uint64_t* p) {
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(p)).load(std::memory_order_acquire);
}

}  // namespace

int main() {
  if (const auto code = ubep::test::exit_without_gpu()) return *code;
  constexpr std::size_t kMax = std::size_t{1} << 20;
  char *src = nullptr, *dst = nullptr;
  std::uint64_t* sig = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&src), kMax + 64));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dst), kMax + 64));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&sig), 4 * sizeof(std::uint64_t)));
  CUDA_OK(cudaMemset(sig, 0, 4 * sizeof(std::uint64_t)));
  StreamWaitStatus* status = nullptr;  // mapped host memory: the GPU writes it, the CPU reads it
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&status), sizeof(StreamWaitStatus), cudaHostAllocMapped));
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));

  std::vector<unsigned char> pattern(kMax + 64), back(kMax + 64);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 131 + 7);
  CUDA_OK(cudaMemcpy(src, pattern.data(), pattern.size(), cudaMemcpyHostToDevice));

  // Every size, the data behind the signal: stream b waits for the signal, then copies dst back.
  {
    bool all = true;
    std::uint64_t epoch = 0;
    struct Ends {
      std::size_t dst, src;  // offsets: both aligned, misaligned alike (head bytes, then vectors), unalike
    };
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{4095},
                              std::size_t{65536 + 3}, kMax}) {
      for (const Ends e : {Ends{0, 0}, Ends{3, 3}, Ends{16, 5}}) {
        ++epoch;
        CUDA_OK(cudaMemsetAsync(dst, 0, kMax + 64, a));
        *status = StreamWaitStatus{};
        LAUNCH_OK(k::put_signal_async(a, dst + e.dst, src + e.src, bytes, sig, epoch, SignalOp::set));
        LAUNCH_OK(k::wait_until_async(b, sig, Cmp::ge, epoch, 5'000'000'000ull, status));
        CUDA_OK(cudaMemcpyAsync(back.data(), dst, kMax + 64, cudaMemcpyDeviceToHost, b));
        CUDA_OK(cudaStreamSynchronize(b));
        bool ok = host_acquire(&status->state) == StreamWaitStatus::met && status->observed == epoch;
        for (std::size_t i = 0; ok && i < bytes; ++i) ok = back[e.dst + i] == pattern[e.src + i];
        for (std::size_t i = 0; ok && i < e.dst; ++i) ok = back[i] == 0;
        if (ok) ok = back[e.dst + bytes] == 0;
        if (!ok) std::printf("  put_signal_async: %zu bytes to +%zu from +%zu wrong\n", bytes, e.dst, e.src);
        all = all && ok;
        CUDA_OK(cudaStreamSynchronize(a));
      }
    }
    check(all, "put_signal_async: 0 B to 1 MiB, aligned and misaligned, data visible behind the signal");
  }

  // Adds accumulate; a set overrides.
  {
    for (int i = 0; i < 5; ++i) LAUNCH_OK(k::signal_op_async(a, sig + 1, 3, SignalOp::add));
    *status = StreamWaitStatus{};
    LAUNCH_OK(k::wait_until_async(a, sig + 1, Cmp::eq, 15, 5'000'000'000ull, status));
    CUDA_OK(cudaStreamSynchronize(a));
    const bool adds = status->state == StreamWaitStatus::met && status->observed == 15;
    LAUNCH_OK(k::signal_op_async(a, sig + 1, 2, SignalOp::set));
    std::uint64_t v = 0;
    CUDA_OK(cudaMemcpyAsync(&v, sig + 1, sizeof v, cudaMemcpyDeviceToHost, a));
    CUDA_OK(cudaStreamSynchronize(a));
    check(adds && v == 2, "signal_op_async: 5 adds of 3 give 15, then a set gives 2");
  }

  // GPU -> CPU through mapped host memory: the CPU acquires the signal, then reads the data.
  {
    char* host_data = nullptr;
    std::uint64_t* host_sig = nullptr;
    CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&host_data), 4096, cudaHostAllocMapped));
    CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&host_sig), sizeof(std::uint64_t), cudaHostAllocMapped));
    std::memset(host_data, 0, 4096);
    *host_sig = 0;
    char* dev_data = nullptr;
    std::uint64_t* dev_sig = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_data), host_data, 0));
    CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_sig), host_sig, 0));
    LAUNCH_OK(k::put_signal_async(a, dev_data, src, 4096, dev_sig, 1, SignalOp::set));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (host_acquire(host_sig) != 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    const bool seen = host_acquire(host_sig) == 1;
    check(seen && std::memcmp(host_data, pattern.data(), 4096) == 0,
          "put_signal_async into mapped host memory: the CPU acquires the signal and reads every byte");
    CUDA_OK(cudaStreamSynchronize(a));

    // CPU -> GPU: a release store on the host ends a stream wait.
    *status = StreamWaitStatus{};
    LAUNCH_OK(k::wait_until_async(b, dev_sig, Cmp::eq, 42, 5'000'000'000ull, status));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const bool held = host_acquire(&status->state) == StreamWaitStatus::pending;
    std::atomic_ref<std::uint64_t>(*host_sig).store(42, std::memory_order_release);
    CUDA_OK(cudaStreamSynchronize(b));
    check(held && status->state == StreamWaitStatus::met && status->observed == 42,
          "wait_until_async holds the stream until a CPU release store, then lets it go");
    CUDA_OK(cudaFreeHost(host_data));
    CUDA_OK(cudaFreeHost(host_sig));
  }

  // A wait that never holds ends at its deadline; the stream goes on.
  {
    *status = StreamWaitStatus{};
    LAUNCH_OK(k::wait_until_async(a, sig + 2, Cmp::ge, 1, 20'000'000ull, status));  // 20 ms
    LAUNCH_OK(k::signal_op_async(a, sig + 3, 9, SignalOp::set));
    std::uint64_t after = 0;
    CUDA_OK(cudaMemcpyAsync(&after, sig + 3, sizeof after, cudaMemcpyDeviceToHost, a));
    CUDA_OK(cudaStreamSynchronize(a));
    check(status->state == StreamWaitStatus::timed_out && status->observed == 0 && status->waited_ns >= 20'000'000 &&
              after == 9,
          "wait_until_async: timed_out at its deadline (20 ms) with the value seen, the stream goes on");
    std::printf("  waited %.3f ms\n", static_cast<double>(status->waited_ns) / 1e6);
  }

  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  CUDA_OK(cudaFree(src));
  CUDA_OK(cudaFree(dst));
  CUDA_OK(cudaFree(sig));
  CUDA_OK(cudaFreeHost(status));
  std::printf("%s\n", failures ? "FAILED" : "PASSED");
  return failures ? 1 : 0;
}
