// How bytes move to one peer. A transport never chooses policy (the route table in runtime/ does) and
// never validates arguments (runtime/ did). Offsets are byte offsets into the peer's symmetric heap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ubep::detail {

enum class AtomicOp : std::uint8_t { fetch_add, compare_swap, swap, fetch, add, set };

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const noexcept = 0;
  /// Locally complete on return: `src` may be reused.
  virtual void put(std::size_t offset, const void* src, std::size_t bytes, int pe) = 0;
  /// Returns at once; `src` may be reused after flush(pe)/flush_all().
  virtual void put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) = 0;
  /// Complete on return.
  virtual void get(void* dst, std::size_t offset, std::size_t bytes, int pe) = 0;
  /// `dst` holds the data after flush(pe)/flush_all().
  virtual void get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) = 0;
  /// A fetching atomic (fetch_add, compare_swap, swap, fetch) on an 8-byte word; complete on return.
  virtual std::uint64_t fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                                     int pe) = 0;
  /// A non-fetching atomic (add, set) on an 8-byte word with release semantics: it becomes visible after
  /// every put to `pe` this rank completed (or ordered with fence) before it. Remote completion at flush.
  virtual void post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) = 0;
  /// A signal update (add, set): post_atomic's ordering and completion; only other signals and waits
  /// touch the word, so a transport may use a cheaper write than a general atomic.
  virtual void post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
    post_atomic(op, offset, operand, pe);
  }
  /// Orders operations to each peer: those issued before are delivered before those issued after.
  virtual void fence() = 0;
  /// Remote completion of everything issued to `pe` (all peers).
  virtual void flush(int pe) = 0;
  virtual void flush_all() = 0;
  /// True when some operation may still be in flight (flush_all would do work).
  virtual bool outstanding() const noexcept = 0;
};

}  // namespace ubep::detail
