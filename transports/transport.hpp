// How bytes move to one peer. A transport never chooses policy (the route table in runtime/ does) and
// never validates arguments (runtime/ did). Offsets are byte offsets into the peer's symmetric heap.
//
// This is the transport-level contract that runtime/ builds the user-visible one on; that one (when
// each Context call completes locally and remotely, whether it blocks, with whom it communicates) is
// the @note of each declaration in include/ubep/context.hpp, and is not restated here. Deferred signals
// are runtime/'s (it holds them back and issues them through post_signal); a transport knows none.
// "Local completion": the call is done with the caller's buffer. "Remote completion": the bytes or the
// update are in the peer's memory. flush(pe) gives both for everything issued to pe before it,
// flush_all() for every peer. LoadStoreTransport completes everything before it returns and never
// blocks; MpiRmaTransport may block in the MPI calls that can wait for the target (mpi_rma.hpp says
// which, and which of them get the deadline).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ubep::detail {

enum class AtomicOp : std::uint8_t { fetch_add, compare_swap, swap, fetch, add, set };

/// A posted atomic (`add`, else `set`) applied to the word at `offset` of a heap mapped here: a release add
/// or store, so whoever acquires the new value sees what the writer stored before. The one update of the
/// load/store path, the runtime's inline signal path and the mpi route's signal messages.
inline void apply_posted(char* base, std::size_t offset, AtomicOp op, std::uint64_t value) noexcept {
  std::atomic_ref<std::uint64_t> w(*reinterpret_cast<std::uint64_t*>(base + offset));
  if (op == AtomicOp::add) {
    w.fetch_add(value, std::memory_order_release);
  } else {
    w.store(value, std::memory_order_release);
  }
}

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const noexcept = 0;
  /// Local completion on return (`src` may be reused); remote completion at flush(pe)/flush_all().
  virtual void put(std::size_t offset, const void* src, std::size_t bytes, int pe) = 0;
  /// Returns at once; local and remote completion at flush(pe)/flush_all().
  virtual void put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) = 0;
  /// Local completion on return: `dst` holds the data.
  virtual void get(void* dst, std::size_t offset, std::size_t bytes, int pe) = 0;
  /// Returns at once; `dst` holds the data after flush(pe)/flush_all().
  virtual void get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) = 0;
  /// A fetching atomic (fetch_add, compare_swap, swap, fetch) on an 8-byte word: local completion on
  /// return (the result is the old value); remote completion at flush(pe)/flush_all().
  virtual std::uint64_t fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                                     int pe) = 0;
  /// A non-fetching atomic (add, set) on an 8-byte word with release semantics: it becomes visible only
  /// after every put and get this rank issued to `pe` before it. Local completion on return (the operand
  /// is the transport's); remote completion at flush(pe)/flush_all().
  virtual void post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) = 0;
  /// A signal update (add, set): post_atomic's ordering and completion; only other signals and waits
  /// touch the word, so a transport may use a cheaper write than a general atomic.
  virtual void post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
    post_atomic(op, offset, operand, pe);
  }
  /// Data, then a signal update, as one operation where the transport can (one message): returns false
  /// when it cannot, and the caller then uses put_nbi + post_signal. Local completion on return with
  /// `wait_local`, else at flush(pe)/flush_all(); the signal lands after the data, remote completion at
  /// flush.
  virtual bool put_with_signal(std::size_t offset, const void* src, std::size_t bytes, AtomicOp op,
                               std::size_t sig_offset, std::uint64_t value, int pe, bool wait_local) {
    return false;
  }
  /// Orders operations to each peer: those issued before are delivered before those issued after.
  /// Completes nothing.
  virtual void fence() = 0;
  /// Local and remote completion of everything issued to `pe` (flush_all: to every peer) before it.
  virtual void flush(int pe) = 0;
  virtual void flush_all() = 0;
  /// Local completion of everything issued to `pe` (sources reusable, get destinations filled), with
  /// no remote completion where the transport can; by default flush(pe).
  virtual void flush_local(int pe) { flush(pe); }
  /// Before a signal to `pe` that must be ordered after this rank's puts to every peer (signal_op): makes
  /// the puts to other peers remotely complete where the transport would not order them before it.
  /// A no-op for transports that complete puts at once (load/store) or order them otherwise (mpi defers
  /// its signals behind a flush of every peer).
  virtual void order_before_signal(int pe) {}
  /// True when some operation may still be in flight (flush_all would do work).
  virtual bool outstanding() const noexcept = 0;
  /// Lets the transport make progress (run arrived messages, answer peers); the runtime calls it from
  /// every wait, poll and collective. A no-op for transports that need no help from this rank's CPU. Returns
  /// whether something landed for this rank (a waiter then looks at its condition again before backing off).
  virtual bool poll() { return false; }
  /// poll() for a caller that must not be interrupted (a collective's wait, a progress thread): an error is kept
  /// and thrown by the next operation or poll() instead.
  virtual void poll_keeping_errors() noexcept {}
  /// The transport and its settings in one line, for ubep-info.
  virtual std::string describe() const { return name(); }
  /// How this transport reaches `pe` (mode, lanes) in one line, for ubep-info; empty when nothing to say.
  virtual std::string describe_peer(int pe) const { return {}; }
};

}  // namespace ubep::detail
