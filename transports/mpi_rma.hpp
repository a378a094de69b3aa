// mpi: passive-target RMA on the world window (MPI_Win_lock_all held for the window's life).
//
// Ordering. MPI orders neither two puts nor a put and an accumulate to another address, so:
//  - post_atomic (the signal path) first flushes the peer when data to it is still in flight: the
//    accumulate is then issued after the data is remotely complete (release semantics);
//  - fence() is lazy: it marks the peers with operations in flight, and the next operation to such a
//    peer flushes it first. A fence with nothing in flight costs nothing.
//  - accumulates (atomics, signals) from one origin to one target are ordered by MPI's default
//    accumulate_ordering, so they need no flush between them.
#pragma once

#include <mpi.h>

#include <deque>
#include <vector>

#include "transports/transport.hpp"

namespace ubep::detail {

class MpiRmaTransport final : public Transport {
 public:
  /// signal_put: SignalOp::set signals as 8-byte MPI_Put instead of MPI_Accumulate (UBEP_MPI_SIGNAL).
  MpiRmaTransport(MPI_Win win, int rank, int nranks, bool signal_put);
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
  /// Remote completion of the puts/gets only (peers with data in flight): what a signal must follow.
  void flush_data();
  bool outstanding() const noexcept override { return !dirty_list_.empty(); }
  /// Win_sync + a probe on `comm`: lets MPI progress RMA aimed at this rank.
  void progress(MPI_Comm comm);

 private:
  void before_op(int pe);  // applies a pending fence
  void mark(int pe, bool data);
  void clear(int pe);
  void after_signal_put(std::size_t offset, int pe);  // orders an update of a word behind a signal put
  const std::uint64_t* operand(std::uint64_t value);  // an origin buffer alive until the next flush
  /// Before an accumulate or signal put on one word: completes the data to pe and earlier updates of the
  /// word, applies a pending fence, and returns the origin buffer holding `value`.
  const std::uint64_t* prepare_word_update(std::size_t offset, std::uint64_t value, int pe);
  void issue_put(std::size_t offset, const void* src, std::size_t bytes, int pe);
  void issue_get(void* dst, std::size_t offset, std::size_t bytes, int pe);

  MPI_Win win_;
  int rank_;
  std::vector<std::uint8_t> dirty_;       // anything in flight to pe
  std::vector<std::uint8_t> data_dirty_;  // a put/get in flight to pe
  std::vector<std::uint8_t> fenced_;      // flush before the next operation to pe
  std::vector<int> dirty_list_;
  bool any_fenced_ = false;
  std::deque<std::uint64_t> operands_;  // origin buffers of posted accumulates, alive until flush
  bool signal_put_;
  std::vector<std::vector<std::size_t>> signal_words_;  // per pe: words with a signal put in flight
};

}  // namespace ubep::detail
