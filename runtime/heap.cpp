#include "runtime/heap.hpp"

#include <iterator>

namespace ubep::detail {

HeapAllocator::HeapAllocator(std::size_t begin, std::size_t end) {
  if (end > begin) add_free(begin, end - begin);
}

void HeapAllocator::add_free(std::size_t offset, std::size_t size) {
  free_.emplace(offset, size);
  by_size_.emplace(size, offset);
  free_bytes_ += size;
}

void HeapAllocator::remove_free(std::map<std::size_t, std::size_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  free_.erase(it);
}

std::optional<std::size_t> HeapAllocator::allocate(std::size_t bytes, std::size_t align) {
  const std::size_t need = slots(bytes);
  if (need < bytes) return std::nullopt;  // wrapped around
  // Free blocks start on a slot, so an alignment of A > kSlot pads by at most A - kSlot: look at a few
  // of the smallest blocks that might fit, then take the smallest that surely does.
  auto fits = [&](std::size_t start, std::size_t size) {
    const std::size_t pad = ((start + align - 1) & ~(align - 1)) - start;
    return pad <= size && size - pad >= need;
  };
  auto it = by_size_.lower_bound({need, 0});
  for (int tries = 0; it != by_size_.end() && !fits(it->second, it->first); ++it) {
    if (++tries == 16) {
      it = by_size_.lower_bound({need + (align > kSlot ? align - kSlot : 0), 0});
      break;
    }
  }
  if (it == by_size_.end()) return std::nullopt;
  const std::size_t start = it->second, size = it->first;
  const std::size_t aligned = (start + align - 1) & ~(align - 1);
  remove_free(free_.find(start));
  if (aligned > start) add_free(start, aligned - start);
  if (size - (aligned - start) > need) add_free(aligned + need, size - (aligned - start) - need);
  live_.emplace(aligned, bytes);
  live_bytes_ += bytes;
  reserved_bytes_ += need;
  return aligned;
}

bool HeapAllocator::release(std::size_t offset) {
  auto it = live_.find(offset);
  if (it == live_.end()) return false;
  recent_.fill(Block{0, 0});
  std::size_t start = it->first, size = slots(it->second);
  live_bytes_ -= it->second;
  reserved_bytes_ -= size;
  live_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + size == next->first) {
    size += next->second;
    auto after = std::next(next);
    remove_free(next);
    next = after;
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      remove_free(prev);
    }
  }
  add_free(start, size);
  return true;
}

std::optional<HeapAllocator::Block> HeapAllocator::find_slow(std::size_t offset) const {
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return std::nullopt;
  --it;
  if (offset >= it->first + it->second) return std::nullopt;
  const Block found{it->first, it->second};
  recent_[next_recent_] = found;
  next_recent_ = (next_recent_ + 1) % kRecent;
  return found;
}

}  // namespace ubep::detail
