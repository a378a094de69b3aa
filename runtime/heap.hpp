// The symmetric heap's allocator: deterministic best fit over 64-byte slots. Every rank runs the same
// sequence of calls and therefore returns the same offsets; the collective wrapper in context.cpp
// verifies that it did.
//
// Every block is reserved in whole slots (kSlot bytes, the minimum alignment), so no gap smaller than a
// slot is ever left behind, and the free blocks are indexed both by offset (to coalesce on release) and
// by size (the smallest block that fits, lowest offset first): allocate and release cost O(log n) in
// the number of free blocks, also on a heap fragmented by many small objects.
#pragma once

#include <array>
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
  /// The live block that contains `offset`, if any: O(1) when it is one of the kRecent blocks found last
  /// (the objects of a loop), O(log n) in the number of live blocks otherwise.
  std::optional<Block> find(std::size_t offset) const {
    if (const Block* b = recent(offset)) return *b;
    return find_slow(offset);
  }
  /// The recently found live block that contains `offset`, or null (then find() looks it up): a few
  /// compares, for the argument checks of every call.
  const Block* recent(std::size_t offset) const noexcept {
    for (const Block& b : recent_) {
      if (offset - b.offset < b.size) return &b;  // unsigned: also false for offset < b.offset
    }
    return nullptr;
  }
  std::size_t largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  std::size_t free_bytes() const { return free_bytes_; }
  /// Bytes requested by the live objects.
  std::size_t bytes_live() const { return live_bytes_; }
  /// Bytes the live objects hold: their requests rounded up to whole slots.
  std::size_t bytes_reserved() const { return reserved_bytes_; }
  std::size_t live_count() const { return live_.size(); }
  static constexpr std::size_t slots(std::size_t bytes) { return (bytes + kSlot - 1) / kSlot * kSlot; }

 private:
  std::optional<Block> find_slow(std::size_t offset) const;
  void add_free(std::size_t offset, std::size_t size);
  void remove_free(std::map<std::size_t, std::size_t>::iterator it);

  std::map<std::size_t, std::size_t> free_;                // offset -> size, coalesced
  std::set<std::pair<std::size_t, std::size_t>> by_size_;  // (size, offset) of every free block
  std::map<std::size_t, std::size_t> live_;                // offset -> requested size
  std::size_t live_bytes_ = 0, reserved_bytes_ = 0, free_bytes_ = 0;
  // The blocks find() looked up last, replaced in turn (empty blocks match nothing); release() clears them.
  // Most calls touch the same few objects again: a payload and its signal, a MoE layer's buffers.
  static constexpr std::size_t kRecent = 4;
  mutable std::array<Block, kRecent> recent_{};
  mutable std::size_t next_recent_ = 0;
};

}  // namespace ubep::detail
