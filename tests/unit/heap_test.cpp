// The symmetric heap's allocator (runtime/heap.hpp): every rank runs it on the same calls, so it must be
// deterministic; it must never hand out overlapping or misaligned blocks, must coalesce what is released,
// and account exactly for what it holds, also on a heap fragmented by many small objects.
#include "runtime/heap.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

using ubep::detail::HeapAllocator;

namespace {

constexpr std::size_t kSlot = HeapAllocator::kSlot;

struct Live {
  std::size_t bytes;
  std::size_t align;
};

// Checks the invariants against an independent record of the live blocks.
void check(const HeapAllocator& heap, const std::map<std::size_t, Live>& live, std::size_t total) {
  std::size_t reserved = 0, requested = 0, end = 0;
  for (const auto& [off, b] : live) {
    ASSERT_EQ(off % b.align, 0u) << "block at " << off << " not aligned to " << b.align;
    ASSERT_GE(off, end) << "block at " << off << " overlaps the one before";
    end = off + HeapAllocator::slots(b.bytes);
    ASSERT_LE(end, total);
    reserved += HeapAllocator::slots(b.bytes);
    requested += b.bytes;
    const auto found = heap.find(off + b.bytes - 1);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->offset, off);
    EXPECT_EQ(found->size, b.bytes);
    // The slot padding behind an object is not part of it: bounds checks see the request.
    if (b.bytes % kSlot) EXPECT_FALSE(heap.find(off + b.bytes).has_value());
  }
  EXPECT_EQ(heap.live_count(), live.size());
  EXPECT_EQ(heap.bytes_live(), requested);
  EXPECT_EQ(heap.bytes_reserved(), reserved);
  EXPECT_EQ(heap.free_bytes() + reserved, total);
  EXPECT_LE(heap.largest_free(), heap.free_bytes());
}

}  // namespace

TEST(HeapAllocator, RandomAllocFreeKeepsInvariants) {
  constexpr std::size_t total = std::size_t{1} << 24;
  HeapAllocator heap(0, total);
  std::map<std::size_t, Live> live;
  std::mt19937_64 rng(12345);
  const std::size_t aligns[] = {64, 64, 64, 128, 4096};
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t bytes = 1 + rng() % (rng() % 8 == 0 ? 65536 : 200);
      const std::size_t align = aligns[rng() % 5];
      const auto off = heap.allocate(bytes, align);
      if (!off) {
        // Only when no free block can hold it.
        EXPECT_LT(heap.largest_free(), HeapAllocator::slots(bytes) + align - kSlot);
        continue;
      }
      ASSERT_TRUE(live.emplace(*off, Live{bytes, align}).second) << "offset " << *off << " handed out twice";
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_TRUE(heap.release(it->first));
      EXPECT_FALSE(heap.release(it->first)) << "released twice";
      live.erase(it);
    }
    if (step % 997 == 0) check(heap, live, total);
  }
  check(heap, live, total);
  for (const auto& [off, b] : live) ASSERT_TRUE(heap.release(off));
  // Everything released: one free block again (coalesced).
  EXPECT_EQ(heap.free_bytes(), total);
  EXPECT_EQ(heap.largest_free(), total);
  EXPECT_EQ(heap.live_count(), 0u);
}

TEST(HeapAllocator, DeterministicForTheSameCalls) {
  HeapAllocator a(0, 1 << 20), b(0, 1 << 20);
  std::mt19937 rng(7);
  std::vector<std::size_t> offs;
  for (int i = 0; i < 5000; ++i) {
    if (offs.empty() || rng() % 2) {
      const std::size_t bytes = 1 + rng() % 3000, align = rng() % 4 ? 64 : 1024;
      const auto x = a.allocate(bytes, align), y = b.allocate(bytes, align);
      ASSERT_EQ(x, y);
      if (x) offs.push_back(*x);
    } else {
      const std::size_t k = rng() % offs.size();
      ASSERT_EQ(a.release(offs[k]), b.release(offs[k]));
      offs.erase(offs.begin() + static_cast<long>(k));
    }
  }
}

// alloc_signals(1) in a loop: 8-byte objects take one slot each and leave no unusable gap, so 2^16 of
// them fill exactly 4 MiB, and freeing every other one leaves holes that the next 8-byte objects reuse.
TEST(HeapAllocator, ManySmallObjectsFillWholeSlots) {
  constexpr std::size_t n = 1 << 16;
  HeapAllocator heap(0, n * kSlot);
  std::vector<std::size_t> offs;
  for (std::size_t i = 0; i < n; ++i) {
    const auto off = heap.allocate(8, 64);
    ASSERT_TRUE(off.has_value()) << "object " << i;
    offs.push_back(*off);
  }
  EXPECT_FALSE(heap.allocate(8, 64).has_value());
  EXPECT_EQ(heap.free_bytes(), 0u);
  for (std::size_t i = 0; i < n; i += 2) ASSERT_TRUE(heap.release(offs[i]));
  EXPECT_EQ(heap.largest_free(), kSlot);
  EXPECT_FALSE(heap.allocate(65, 64).has_value()) << "no two adjacent slots are free";
  for (std::size_t i = 0; i < n; i += 2) ASSERT_TRUE(heap.allocate(8, 64).has_value()) << "hole " << i;
  EXPECT_EQ(heap.free_bytes(), 0u);
}

TEST(HeapAllocator, LargeAlignmentPadsBackIntoTheFreeList) {
  HeapAllocator heap(0, 1 << 16);
  ASSERT_EQ(heap.allocate(8, 64), 0u);
  const auto big = heap.allocate(100, 4096);
  ASSERT_EQ(big, 4096u);
  // The pad [64, 4096) is free again and serves the next small object.
  EXPECT_EQ(heap.allocate(8, 64), 64u);
  EXPECT_EQ(heap.bytes_reserved(), 4 * kSlot);  // 8 -> 1 slot, 100 -> 2, 8 -> 1
}

// find() answers from the blocks it looked up last when it can; a release must never leave a freed block
// there, and a block allocated in its place must be seen with its own size.
TEST(HeapAllocator, RecentLookupsForgetReleasedBlocks) {
  HeapAllocator heap(0, 1 << 20);
  std::vector<std::size_t> offs;
  for (std::size_t i = 0; i < 8; ++i) offs.push_back(*heap.allocate(100 + i, kSlot));
  for (int pass = 0; pass < 3; ++pass) {
    for (std::size_t i = 0; i < offs.size(); ++i) {
      const auto b = heap.find(offs[i] + 99);
      ASSERT_TRUE(b.has_value());
      EXPECT_EQ(b->offset, offs[i]);
      EXPECT_EQ(b->size, 100 + i);
      ASSERT_NE(heap.recent(offs[i]), nullptr);  // the lookup just made
      EXPECT_EQ(heap.recent(offs[i])->offset, offs[i]);
    }
  }
  ASSERT_TRUE(heap.release(offs[7]));
  EXPECT_EQ(heap.recent(offs[7]), nullptr);
  EXPECT_FALSE(heap.find(offs[7]).has_value());
  const auto again = heap.allocate(10, kSlot);
  ASSERT_TRUE(again.has_value());
  const auto b = heap.find(*again);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->size, 10u);
  EXPECT_FALSE(heap.find(*again + 10).has_value());                       // not the old block's size
  EXPECT_EQ(heap.recent(offs[0] + 1 + (std::size_t{1} << 40)), nullptr);  // far outside: no block
}
