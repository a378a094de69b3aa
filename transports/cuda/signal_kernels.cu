// The kernels behind transports/cuda/signal_kernels.hpp (which says what each one promises). Every signal update
// and every poll goes through the three functions below, so the PTX of this file shows the orderings that the
// header promises (tests/gpu/check_ptx.py).
#include <cuda_runtime_api.h>

#include <cuda/atomic>
#include <string>

#include "transports/cuda/signal_kernels.hpp"

namespace ubep::detail::cuda {
namespace {

using Word = unsigned long long;
static_assert(sizeof(Word) == sizeof(std::uint64_t));
using SystemWord = ::cuda::atomic_ref<Word, ::cuda::thread_scope_system>;

__device__ SystemWord system_word(const std::uint64_t* p) {
  return SystemWord(*reinterpret_cast<Word*>(const_cast<std::uint64_t*>(p)));
}

// A signal update: a full fence at system scope (the writes of every thread of the block, made visible to this
// thread by the caller's __syncthreads, are ordered before it), then a release store or add at system scope.
__device__ void release_update(std::uint64_t* sig, std::uint64_t value, SignalOp op) {
  ::cuda::atomic_thread_fence(::cuda::memory_order_seq_cst, ::cuda::thread_scope_system);
  if (op == SignalOp::add) {
    system_word(sig).fetch_add(value, ::cuda::memory_order_release);
  } else {
    system_word(sig).store(value, ::cuda::memory_order_release);
  }
}

__device__ std::uint64_t acquire_load(const std::uint64_t* sig) {
  return system_word(sig).load(::cuda::memory_order_acquire);
}

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

constexpr int kPutThreads = 256;

__global__ void put_signal_kernel(char* dst, const char* src, std::size_t bytes, std::uint64_t* sig,
                                  std::uint64_t value, SignalOp op) {
  const std::size_t tid = threadIdx.x;
  std::size_t done = 0;
  // 16-byte vectors where both ends are aligned alike, bytes for the head and the tail.
  const std::size_t dst_mis = reinterpret_cast<std::uintptr_t>(dst) % 16;
  if (dst_mis == reinterpret_cast<std::uintptr_t>(src) % 16) {
    const std::size_t head = dst_mis ? 16 - dst_mis : 0;
    if (head < bytes) {
      for (std::size_t i = tid; i < head; i += blockDim.x) dst[i] = src[i];
      const std::size_t vectors = (bytes - head) / 16;
      auto* d = reinterpret_cast<uint4*>(dst + head);
      const auto* s = reinterpret_cast<const uint4*>(src + head);
      for (std::size_t i = tid; i < vectors; i += blockDim.x) d[i] = s[i];
      done = head + vectors * 16;
    }
  }
  for (std::size_t i = done + tid; i < bytes; i += blockDim.x) dst[i] = src[i];
  __syncthreads();
  if (tid == 0) release_update(sig, value, op);
}

__global__ void signal_op_kernel(std::uint64_t* sig, std::uint64_t value, SignalOp op) {
  release_update(sig, value, op);
}

__global__ void wait_until_kernel(const std::uint64_t* sig, Cmp cmp, std::uint64_t value, std::uint64_t timeout_ns,
                                  StreamWaitStatus* status) {
  const std::uint64_t start = global_timer_ns();
  unsigned backoff_ns = 32;
  std::uint64_t seen = acquire_load(sig);
  std::uint64_t state = StreamWaitStatus::met;
  while (!compare(seen, cmp, value)) {
    if (timeout_ns != 0 && global_timer_ns() - start >= timeout_ns) {
      state = StreamWaitStatus::timed_out;
      break;
    }
    __nanosleep(backoff_ns);
    if (backoff_ns < 1024) backoff_ns *= 2;
    seen = acquire_load(sig);
  }
  status->observed = seen;
  status->waited_ns = global_timer_ns() - start;
  system_word(&status->state).store(state, ::cuda::memory_order_release);
}

// The launch's own error (a kernel launch returns nothing): cudaGetLastError right after it.
int launched() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int put_signal_async(void* stream, void* dst, const void* src, std::size_t bytes, std::uint64_t* sig,
                     std::uint64_t value, SignalOp op) {
  put_signal_kernel<<<1, kPutThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<char*>(dst), static_cast<const char*>(src), bytes, sig, value, op);
  return launched();
}

int signal_op_async(void* stream, std::uint64_t* sig, std::uint64_t value, SignalOp op) {
  signal_op_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(sig, value, op);
  return launched();
}

int wait_until_async(void* stream, const std::uint64_t* sig, Cmp cmp, std::uint64_t value, std::uint64_t timeout_ns,
                     StreamWaitStatus* status) {
  wait_until_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(sig, cmp, value, timeout_ns, status);
  return launched();
}

int load_kernels() {
  cudaFuncAttributes attributes{};
  for (const void* kernel :
       {reinterpret_cast<const void*>(&put_signal_kernel), reinterpret_cast<const void*>(&signal_op_kernel),
        reinterpret_cast<const void*>(&wait_until_kernel)}) {
    if (const cudaError_t rc = cudaFuncGetAttributes(&attributes, kernel); rc != cudaSuccess) {
      return static_cast<int>(rc);
    }
  }
  return 0;
}

std::string error_string(int cuda_error) {
  const auto rc = static_cast<cudaError_t>(cuda_error);
  return std::string(cudaGetErrorName(rc)) + " (" + cudaGetErrorString(rc) + ")";
}

}  // namespace ubep::detail::cuda
