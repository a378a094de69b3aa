// Blocking MPI calls with a deadline. MPI_Win_flush, a fetching atomic or an accumulate under Open MPI's
// osc ucx over TCP completes only when the target calls into MPI: a stalled peer would block the caller
// inside MPI forever, and no MPI call can be cancelled. So such calls run on a worker thread, and the
// caller polls for their completion with the usual back-off and UBEP_WAIT_TIMEOUT. When the deadline
// passes, the caller throws Errc::timeout naming the MPI call and the peer; the call itself stays
// pending in MPI, and the next bounded call first waits (again with the deadline) for it to finish, so a
// peer that resumes heals the context. Needs MPI_THREAD_MULTIPLE; without it, or with no timeout
// (UBEP_WAIT_TIMEOUT=0), calls run inline on the caller's thread, unbounded.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "ubep/options.hpp"

namespace ubep::detail {

class BoundedCaller {
 public:
  /// bounded = false: run every call inline (no deadline). `rank` names this rank in reports.
  BoundedCaller(bool bounded, std::chrono::duration<double> timeout, const PollPolicy& poll, int rank);
  BoundedCaller(const BoundedCaller&) = delete;
  BoundedCaller& operator=(const BoundedCaller&) = delete;
  /// Joins the worker when it is idle; detaches it when a call is still stuck inside MPI (it then owns
  /// the job and its buffers, and ends with the process).
  ~BoundedCaller();

  /// Runs `fn` (which may throw ubep::Error) to completion; rethrows what it threw. Throws
  /// Errc::timeout, naming `what` (the MPI call) and `pe`, when it has not returned by the deadline.
  /// Buffers that `fn` writes after a timeout must belong to `fn` itself (captured by value), never to
  /// the caller's stack: use scratch() for results.
  /// `started`, when given, is set once `fn` has been handed to MPI (posted to the worker, or run inline): from
  /// then on its operation happens, even if this call throws a timeout.
  void run(const char* what, int pe, std::function<void()> fn, bool* started = nullptr);
  /// Eight words owned by the worker's shared state: the results of a fetching atomic land here, so a
  /// call that completes after its caller timed out writes into live memory.
  std::uint64_t* scratch() noexcept;
  bool bounded() const noexcept { return bounded_; }

  struct Shared;  // the job slot, shared with the worker (which may outlive this object)

 private:
  void wait_done(const char* what, int pe, bool earlier);
  bool bounded_;
  std::chrono::duration<double> timeout_;
  PollPolicy poll_;
  int rank_;
  std::shared_ptr<Shared> shared_;
  std::thread worker_;
  std::uint64_t inline_scratch_[8] = {};
};

}  // namespace ubep::detail
