// The symmetric heap's allocator: a deterministic first-fit free list over offsets. Every rank runs the
// same sequence of calls and therefore returns the same offsets; the collective wrapper in context.cpp
// verifies that it did.
#pragma once

#include <cstddef>
#include <map>
#include <optional>

namespace ubep::detail {

class HeapAllocator {
 public:
  struct Block {
    std::size_t offset;
    std::size_t size;
  };

  HeapAllocator() = default;
  /// Manages [begin, end) of the heap.
  HeapAllocator(std::size_t begin, std::size_t end);

  /// First block of `bytes` (> 0) aligned to `align` (a power of two); nullopt when nothing fits.
  std::optional<std::size_t> allocate(std::size_t bytes, std::size_t align);
  /// Releases the live block starting at `offset`; returns false when there is none.
  bool release(std::size_t offset);
  /// The live block that contains `offset`, if any.
  std::optional<Block> find(std::size_t offset) const;
  std::size_t largest_free() const;
  std::size_t bytes_live() const { return live_bytes_; }
  std::size_t live_count() const { return live_.size(); }

 private:
  std::map<std::size_t, std::size_t> free_;  // offset -> size, coalesced
  std::map<std::size_t, std::size_t> live_;  // offset -> size
  std::size_t live_bytes_ = 0;
  mutable Block last_{0, 0};  // the block find() returned last: most calls hit the same object again
};

}  // namespace ubep::detail
