// The symmetric heap's allocator: deterministic best fit over 64-byte slots. Every rank runs the same
// sequence of calls and therefore returns the same offsets; the collective wrapper in context.cpp
// verifies that it did.
//
// Every block is reserved in whole slots (kSlot bytes, the minimum alignment), so no gap smaller than a
// slot is ever left behind, and the free blocks are indexed both by offset (to coalesce on release) and
// by size (the smallest block that fits, lowest offset first): allocate and release cost O(log n) in
// the number of free blocks, also on a heap fragmented by many small objects.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace ubep::detail {

class HeapAllocator {
 public:
  /// Reservation granularity and minimum alignment, in bytes.
  static constexpr std::size_t kSlot = 64;

  struct Block {
    std::size_t offset;
    std::size_t size;  // as requested: bounds checks see the object, not its slots
  };

  HeapAllocator() = default;
  /// Manages [begin, end) of the heap; begin and end are multiples of kSlot.
  HeapAllocator(std::size_t begin, std::size_t end);

  /// A block of `bytes` (> 0) aligned to `align` (a power of two, at least kSlot); nullopt when nothing fits.
  std::optional<std::size_t> allocate(std::size_t bytes, std::size_t align);
  /// Releases the live block starting at `offset`; returns false when there is none.
  bool release(std::size_t offset);
  /// The live block that contains `offset`, if any.
  std::optional<Block> find(std::size_t offset) const;
  std::size_t largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  std::size_t free_bytes() const { return free_bytes_; }
  /// Bytes requested by the live objects.
  std::size_t bytes_live() const { return live_bytes_; }
  /// Bytes the live objects hold: their requests rounded up to whole slots.
  std::size_t bytes_reserved() const { return reserved_bytes_; }
  std::size_t live_count() const { return live_.size(); }
  static constexpr std::size_t slots(std::size_t bytes) { return (bytes + kSlot - 1) / kSlot * kSlot; }

 private:
  void add_free(std::size_t offset, std::size_t size);
  void remove_free(std::map<std::size_t, std::size_t>::iterator it);

  std::map<std::size_t, std::size_t> free_;                // offset -> size, coalesced
  std::set<std::pair<std::size_t, std::size_t>> by_size_;  // (size, offset) of every free block
  std::map<std::size_t, std::size_t> live_;                // offset -> requested size
  std::size_t live_bytes_ = 0, reserved_bytes_ = 0, free_bytes_ = 0;
  mutable Block last_{0, 0};  // the block find() returned last: most calls hit the same object again
};

}  // namespace ubep::detail
