#include "runtime/heap.hpp"

#include <iterator>

namespace ubep::detail {

HeapAllocator::HeapAllocator(std::size_t begin, std::size_t end) {
  if (end > begin) free_.emplace(begin, end - begin);
}

std::optional<std::size_t> HeapAllocator::allocate(std::size_t bytes, std::size_t align) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::size_t start = it->first, size = it->second;
    const std::size_t aligned = (start + align - 1) & ~(align - 1);
    const std::size_t pad = aligned - start;
    if (pad > size || size - pad < bytes) continue;
    free_.erase(it);
    if (pad) free_.emplace(start, pad);
    if (size - pad > bytes) free_.emplace(aligned + bytes, size - pad - bytes);
    live_.emplace(aligned, bytes);
    live_bytes_ += bytes;
    return aligned;
  }
  return std::nullopt;
}

bool HeapAllocator::release(std::size_t offset) {
  auto it = live_.find(offset);
  if (it == live_.end()) return false;
  last_ = Block{0, 0};
  std::size_t start = it->first, size = it->second;
  live_bytes_ -= size;
  live_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return true;
    }
  }
  free_.emplace(start, size);
  return true;
}

std::optional<HeapAllocator::Block> HeapAllocator::find(std::size_t offset) const {
  if (offset - last_.offset < last_.size) return last_;
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return std::nullopt;
  --it;
  if (offset >= it->first + it->second) return std::nullopt;
  last_ = Block{it->first, it->second};
  return last_;
}

std::size_t HeapAllocator::largest_free() const {
  std::size_t best = 0;
  for (const auto& [off, size] : free_) best = size > best ? size : best;
  return best;
}

}  // namespace ubep::detail
