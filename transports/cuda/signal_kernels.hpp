// transports/cuda/signal_kernels.hpp: signals written and awaited by the GPU, in stream order (issue 15). The
// kernels are in signal_kernels.cu, compiled by nvcc for CMAKE_CUDA_ARCHITECTURES (default 90: sm_90 code plus
// compute_90 PTX, which newer GPUs JIT); this header has no CUDA types, so C++ sources include it as they are.
//
// Memory model (what tests/gpu/check_ptx.py checks in the PTX): a signal update is a release operation at
// system scope (st.release.sys / atom.add.release.sys), preceded by fence.sc.sys, so a CPU thread or another
// GPU that acquires the new value (ld.acquire.sys here, an acquire load on the host) sees every byte the
// kernel's threads wrote before it, to local, peer-mapped or host memory; a wait's poll is an acquire load at
// system scope. The signal words may be device memory, a node peer's mapped GPU heap or host memory mapped
// for the device (cudaHostAlloc + cudaHostAllocMapped, or the host heap registered with cudaHostRegister).
// A set is one 64-bit store and is right on every one of them. An add is a read-modify-write: atomic with the
// other GPU atomics on the same device memory, but on host memory it is atomic with the CPU's atomics on that
// word only where the device reports cudaDevAttrHostNativeAtomicSupported (NVLink-C2C systems; not a GPU
// behind PCIe), so an add that a CPU thread may race (any signal in the host heap) does not go through these
// kernels: the runtime applies it from a host callback in stream order (runtime/stream.cpp,
// signal_on_stream), and the kernels' add is for signals in device memory.
//
// Every launcher takes the stream as a cudaStream_t passed through `void*` (nullptr = the legacy default
// stream) and returns the cudaError_t of the launch as an int (0 = cudaSuccess); a kernel never fails after a
// successful launch except for a bad address (the stream's next synchronization reports it). The transports
// layer never validates arguments: the runtime does before it calls these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ubep/signal.hpp"

namespace ubep::detail::cuda {

/// Copies `bytes` from `src` to `dst` (device-accessible addresses: device, peer-mapped or mapped host memory)
/// with the threads of one block, then updates `*sig` (set or add `value`) as a release at system scope: an
/// observer that acquires the update sees the data. `bytes` may be 0 (the signal alone). One block: the path for
/// latency-bound puts; large payloads go through the copy engines (cudaMemcpyAsync), then signal_op_async.
/// Complete when the stream reaches it; the caller's `src` may be reused once the stream has passed it.
int put_signal_async(void* stream, void* dst, const void* src, std::size_t bytes, std::uint64_t* sig,
                     std::uint64_t value, SignalOp op);

/// Updates `*sig` (set or add `value`) as a release at system scope when the stream reaches it: everything the
/// stream wrote before (kernels and copies completed in stream order) is visible to whoever acquires it.
int signal_op_async(void* stream, std::uint64_t* sig, std::uint64_t value, SignalOp op);

/// What a stream wait ended with, written by the GPU into memory the host can read (mapped host memory).
struct StreamWaitStatus {
  enum : std::uint64_t { pending = 0, met = 1, timed_out = 2 };
  std::uint64_t state = pending;  ///< written last, as a release at system scope
  std::uint64_t observed = 0;     ///< the signal's value when the wait ended
  std::uint64_t waited_ns = 0;    ///< %globaltimer time from the wait's first poll to its end
};

/// Holds the stream until `*sig <cmp> value` (acquire loads at system scope, backing off with __nanosleep up to
/// 1 µs between polls), or until `timeout_ns` nanoseconds of the GPU's global timer have passed (0 = no
/// deadline): a stream wait never hangs forever unless asked to. Then writes `*status` (met or timed_out, the
/// value observed, the time waited) and lets the stream go on: the caller checks `status` after the stream
/// and turns timed_out into ubep::Error (Errc::timeout) naming the signal, the value and the condition.
/// Occupies one thread of one block while it waits.
int wait_until_async(void* stream, const std::uint64_t* sig, Cmp cmp, std::uint64_t value, std::uint64_t timeout_ns,
                     StreamWaitStatus* status);

/// Loads the three kernels into the current context now (cudaFuncGetAttributes on each). CUDA loads modules
/// lazily by default (CUDA_MODULE_LOADING=LAZY since 12.2), and loading one at its first launch may need a
/// context-wide synchronization: a first put_signal launched while a wait_until kernel spins would then wait
/// for that wait, until its deadline. The runtime calls this when it sets up the stream calls, before any
/// kernel runs. Returns the first error (0 = all loaded).
int load_kernels();

/// "cudaErrorInvalidValue (invalid argument)": the name and text of a launcher's result, for messages.
std::string error_string(int cuda_error);

}  // namespace ubep::detail::cuda
