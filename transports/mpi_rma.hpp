// mpi: passive-target RMA on the world window (MPI_Win_lock_all held for the window's life).
//
// Completion (Transport's contract; the user-visible one is the @note of each call in
// include/ubep/context.hpp). Nothing is remotely complete before flush(pe)/flush_all() (one
// MPI_Win_flush per peer with operations in flight). put/get are locally complete on return through
// MPI_Win_flush_local(pe); fetching atomics return their result through MPI_Win_flush_local(pe) and
// still count as in flight; put_nbi/get_nbi, post_atomic and post_signal only issue. Besides those
// flushes and the MPI calls themselves, a call blocks only for the flushes that ordering needs (below).
//
// Ordering. MPI orders neither two puts nor a put and an accumulate to another address, so:
//  - post_atomic (the signal path) first flushes the peer when data to it is still in flight: the
//    accumulate is then issued after the data is remotely complete (release semantics);
//  - fence() is lazy: it marks the peers with operations in flight, and the next operation to such a
//    peer flushes it first. A fence with nothing in flight costs nothing.
//  - accumulates (atomics, signals) from one origin to one target word are ordered by MPI's default
//    accumulate_ordering, so they need no flush between them; a put is ordered with nothing, so an
//    update of a word by put after any update of it (or any update after a put of it) in flight to the
//    same peer flushes that peer first: one word's updates stay in program order.
//  - every call that can wait for the target (flush, flush_local, fetching atomics, accumulates, which
//    osc ucx runs under a remote lock) goes through blocking(), which runs it under BoundedCaller's
//    deadline where the constructor's policy says so (UBEP_MPI_BOUNDED), so a stalled peer gives a
//    timeout; the rest run inline. MPI_Put, MPI_Get (they only issue), MPI_Win_sync and MPI_Iprobe
//    always run inline.
//  - the origin buffers of posted accumulates live until a flush; once 4096 are in flight, flush_all().
//
// Signals as messages (UBEP_MPI_SIGNAL=message, the default of SimGrid builds): post_signal completes the
// data to pe as above, then sends {offset, op, value} with MPI_Isend on `chan`, a communicator that carries
// nothing else; the target checks each message (offset inside its heap, aligned, op add or set; the source is
// MPI's) and applies it to its heap word (a release store or add) in deliver(), which its waits, tests,
// progress() and barrier() call. MPI keeps messages from one origin in order, so one origin's signals to one
// word stay in program order. A send never blocks: once kMaxSignalSends sends wait for their targets (a
// target that does not call MPI), the next one first waits for one of them with the deadline, and when that
// passes it goes out all the same and throws Errc::timeout naming the targets (no signal is lost, none blocks
// for longer than the deadline). A signal word must then be updated by signals
// only (no atomics on it): an applied message is not atomic with an MPI accumulate on that word. In
// SimGrid builds, where a wait blocks on the next message, every non-fetching atomic (atomic_set,
// atomic_add) is followed by a flush and a message that changes no word (wake), so that a wait on such a
// word returns too; fetching atomics send none (a word that only they change is seen at the next message).
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transports/bounded_call.hpp"
#include "transports/transport.hpp"

namespace ubep::detail {

/// A signal message {offset, op, value} as it arrives (UBEP_MPI_SIGNAL=message): its word an aligned word inside
/// the `heap_bytes`-byte heap, its op add or set (or `wake`, the SimGrid builds' message that changes no word).
/// Empty when valid, else what is wrong, naming the field.
std::string check_signal_message(std::uint64_t offset, std::uint64_t op, std::size_t heap_bytes, std::uint64_t wake);

class MpiRmaTransport final : public Transport {
 public:
  /// signal_put: SignalOp::set signals as 8-byte MPI_Put instead of MPI_Accumulate (UBEP_MPI_SIGNAL).
  /// bounded: blocking MPI calls may get the deadline `timeout` (BoundedCaller): fetching atomics to
  /// every peer, flushes and accumulates to peers with off_host[pe] != 0, or every call with `all`.
  /// chan: with signals as messages, the communicator they travel on (MPI_COMM_NULL otherwise); base: this
  /// rank's heap, where they are applied.
  MpiRmaTransport(MPI_Win win, int rank, int nranks, bool signal_put, bool bounded, bool all,
                  std::vector<std::uint8_t> off_host, std::chrono::duration<double> timeout, const PollPolicy& poll,
                  MPI_Comm chan = MPI_COMM_NULL, char* base = nullptr, std::size_t heap_bytes = 0);
  ~MpiRmaTransport() override;
  const char* name() const noexcept override { return "mpi"; }
  void put(std::size_t offset, const void* src, std::size_t bytes, int pe) override;
  void put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) override;
  void get(void* dst, std::size_t offset, std::size_t bytes, int pe) override;
  void get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) override;
  std::uint64_t fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                             int pe) override;
  void post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) override;
  void post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) override;
  void fence() override;
  void flush(int pe) override;
  void flush_all() override;
  /// flush(pe) for every peer with a put or get in flight (which completes everything else to it too):
  /// what a deferred signal must follow.
  void flush_data();
  bool outstanding() const noexcept override { return !dirty_list_.empty(); }
  /// Win_sync + a probe on `comm`: lets MPI progress RMA aimed at this rank; applies arrived signal messages.
  void progress(MPI_Comm comm);
  /// Signals as messages: applies every signal message that has arrived, or, with `block`, waits in
  /// MPI_Wait for one first (no deadline: for SimGrid, where a blocked rank yields to the simulation).
  /// Returns how many it applied. Without signal messages: 0.
  std::size_t deliver(bool block);
  bool signal_messages() const noexcept { return chan_ != MPI_COMM_NULL; }
  /// Signals and non-fetching atomics handed to MPI so far (the call that issues them started, whether or not
  /// it then completed within the deadline): a deferred signal counted here is never issued again.
  std::uint64_t updates_issued() const noexcept { return updates_issued_; }
  /// Cancels the posted receive of signal messages (before the communicator is freed); sends still unreceived
  /// are left to MPI (their buffers kept). Local.
  void close() noexcept;
  /// Signal messages sent to each peer and applied here, since the start (barrier() matches them up).
  const std::vector<std::uint64_t>& messages_sent() const noexcept { return sent_; }
  std::uint64_t messages_applied() const noexcept { return applied_; }

 private:
  void before_op(int pe);  // applies a pending fence
  void mark(int pe, bool data);
  void clear(int pe);
  /// Flushes pe when an update of `offset` in flight to it is not ordered before a new one: either of
  /// the two is a put (`by_put`: the new one is); then records the new update if `record`.
  void order_word_update(std::size_t offset, int pe, bool by_put, bool record);
  const std::uint64_t* operand(std::uint64_t value);  // an origin buffer alive until the next flush
  /// Before an accumulate or signal put on one word: completes the data to pe and earlier updates of the
  /// word that MPI does not order before it, applies a pending fence, and returns the origin buffer.
  const std::uint64_t* prepare_word_update(std::size_t offset, std::uint64_t value, int pe, bool by_put);
  void flush_checked(int pe, const char* what);  // MPI_Win_flush(pe) with the deadline
  void flush_local(int pe, const char* what);    // MPI_Win_flush_local(pe) with the deadline
  void issue_put(std::size_t offset, const void* src, std::size_t bytes, int pe);
  void issue_get(void* dst, std::size_t offset, std::size_t bytes, int pe);
  /// SimGrid builds with signal messages: after a non-fetching atomic to pe, flush it and send pe a message that
  /// changes nothing, so that a rank blocked in a wait there looks at its words again.
  void wake(int pe);

  MPI_Win win_;
  int rank_;
  std::vector<std::uint8_t> dirty_;       // anything in flight to pe
  std::vector<std::uint8_t> data_dirty_;  // a put/get in flight to pe
  std::vector<std::uint8_t> fenced_;      // flush before the next operation to pe
  std::vector<int> dirty_list_;
  bool any_fenced_ = false;
  std::deque<std::uint64_t> operands_;  // origin buffers of posted accumulates, alive until flush
  bool signal_put_;
  struct WordUpdate {
    std::size_t offset;
    bool by_put;  // some update of this word in flight is a put (else all are accumulates)
  };
  std::vector<std::vector<WordUpdate>> word_updates_;  // per pe: updated words in flight
  /// Runs a blocking MPI call on `pe` with the deadline where the policy says so, inline otherwise.
  void blocking(const char* what, int pe, bool always, std::function<void()> fn, bool* started = nullptr);
  std::vector<std::uint8_t> bounded_;  // per pe: flushes and accumulates get the deadline
  BoundedCaller blocking_;
  // Signals as messages.
  MPI_Comm chan_;
  char* base_;
  MPI_Request recv_ = MPI_REQUEST_NULL;  // the posted receive of the next message into inbox_
  std::uint64_t inbox_[3] = {0, 0, 0};   // offset, op (AtomicOp), value
  std::vector<std::uint64_t> sent_;
  std::uint64_t applied_ = 0;
  std::size_t heap_bytes_ = 0;  // this rank's heap: a message's word must lie inside it
  std::uint64_t updates_issued_ = 0;
  /// Sends in flight (MPI_Isend): requests, their buffers and targets, in parallel.
  static constexpr std::size_t kMaxSignalSends = 4096;
  std::vector<MPI_Request> send_reqs_;
  std::vector<std::unique_ptr<std::array<std::uint64_t, 3>>> send_bufs_;
  std::vector<int> send_to_;
  std::vector<std::unique_ptr<std::array<std::uint64_t, 3>>> free_bufs_;
  std::chrono::duration<double> timeout_;
  const PollPolicy& poll_;
  /// Sends {offset, op, value} to pe (see "Signals as messages").
  void send_message(std::uint64_t offset, std::uint64_t op, std::uint64_t value, int pe, const char* what);
  /// Frees the buffers of completed sends; returns how many are still in flight.
  std::size_t reap_messages(const char* what);
};

}  // namespace ubep::detail
