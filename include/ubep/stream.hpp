/// \file stream.hpp
/// Signals written and awaited by a CUDA stream (Context::put_signal_on_stream, signal_op_on_stream,
/// wait_until_on_stream): GPU work publishes data and signals to node peers, and waits for their signals,
/// in stream order, without a host round trip. This header needs no CUDA header: GpuStream is the type
/// cudaStream_t and CUstream name (a pointer to the driver's opaque struct CUstream_st).
///
/// What holds (CUDA builds with ubep's kernels; elsewhere every call throws Errc::unsupported):
///  - Signals and destinations are words and ranges of the symmetric host heap, of this rank (waits) or of
///    a peer whose data and signals are load/store: route(pe) is self or shm and atomics_through_mpi() is
///    false (with UCX in use, mapped peers keep load/store atomics). Other peers throw Errc::unsupported
///    naming the route, or saying that the signals go through MPI; stream calls do not take the staged route
///    to other nodes (Context::put_signal does, for GPU-heap data).
///  - A stream call is ordered after the stream's earlier work, not after this rank's host-side calls: puts
///    on the mpi or ucx route that the signal must cover need quiet() before the stream call is enqueued.
///  - A signal `set` from a stream is a release store at system scope after a system-scope fence, so a CPU
///    (or GPU) that observes it sees the data of that call and everything the stream did before. A signal
///    `add` is applied by a host callback of the stream (cudaLaunchHostFunc) as a CPU release add: atomic
///    with every CPU atomic and signal of ubep, which a GPU atomic on host memory over PCIe is not.
///  - A stream wait polls with acquire loads at system scope and ends at its deadline (WaitOptions::timeout,
///    else UBEP_WAIT_TIMEOUT; 0 = none) on the GPU's clock: it never holds a stream forever. Its StreamWait
///    says whether it was met; a timed-out one throws Errc::timeout with a report when asked for its result.
///  - The first stream call of a context registers the mapped host heaps of this rank's node peers with CUDA
///    (cudaHostRegister, mapped), and finalize() unregisters them: synchronize the streams that used the
///    context before finalize(). It also loads ubep's kernels into the current CUDA context and allocates 64
///    stream-wait slots, so that no later call loads a module or allocates while a stream wait spins (CUDA
///    loads kernels lazily, and either may wait for the running kernels: a put meant to satisfy the wait would
///    wait for its deadline). More than 64 waits in flight at once allocate another 64 at that call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ubep/signal.hpp"

struct CUstream_st;

namespace ubep {

/// A CUDA stream: a cudaStream_t or CUstream converts to it without a cast; nullptr is the legacy default
/// stream.
using GpuStream = CUstream_st*;

namespace detail {
class State;
struct StreamWaitSlot;
}  // namespace detail

/// The outcome of one Context::wait_until_on_stream, filled in by the GPU when the stream passes the wait.
/// Move-only; it may outlive neither its Context's finalize() (then every call throws Errc::finalized) nor
/// be read from another thread while its Context is in use.
class StreamWait {
 public:
  StreamWait() = default;
  StreamWait(StreamWait&&) noexcept;
  StreamWait& operator=(StreamWait&&) noexcept;
  StreamWait(const StreamWait&) = delete;
  StreamWait& operator=(const StreamWait&) = delete;
  /// Gives the status memory back to the context once the stream has passed the wait; a wait the stream has
  /// not reached keeps its memory until finalize() (the GPU may still write it). Never throws.
  ~StreamWait();

  /// Whether the stream has passed the wait (its condition held, or its deadline passed). Never blocks.
  /// Throws Errc::finalized after the context's finalize(), Errc::invalid_argument on an empty handle.
  bool done() const;
  /// The signal's value when the stream went on. Throws Errc::timeout when the deadline passed first (the
  /// report names the rank, the signal's heap offset, the condition, the value seen, the time waited and
  /// the expected writers), Errc::invalid_argument when the stream has not passed the wait yet (synchronize
  /// the stream first), Errc::finalized after the context's finalize().
  std::uint64_t result() const;

 private:
  friend class Context;
  struct Wait {
    std::size_t offset = 0;  // of the signal in the heap
    Cmp cmp = Cmp::ge;
    std::uint64_t value = 0;
    double timeout_s = 0;
    std::vector<int> writers;
    std::string what;
  };
  StreamWait(std::shared_ptr<detail::State> state, detail::StreamWaitSlot* slot, Wait wait);
  std::shared_ptr<detail::State> state_;
  detail::StreamWaitSlot* slot_ = nullptr;
  Wait wait_;
};

}  // namespace ubep
