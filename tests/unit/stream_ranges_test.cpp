// The host ranges the first stream call registers with CUDA (runtime/gpu_streams.hpp, merge_host_ranges): CUDA
// refuses two registrations of one page, and a range over an unmapped gap fails, so node heaps that share or
// touch a page become one range and heaps further apart stay apart, in address order, with their peers.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/gpu_streams.hpp"

namespace ubep::detail {
namespace {

constexpr std::uintptr_t kPage = 4096;

TEST(StreamRanges, ContiguousHeapsOfANodeBecomeOneRange) {
  // Open MPI's shared window: the heaps of 4 ranks back to back, given in rank order.
  std::vector<HostRange> in;
  for (int pe = 0; pe < 4; ++pe) in.push_back({0x100000 + pe * 0x10000u, 0x100000 + (pe + 1) * 0x10000u, {pe}});
  const auto out = merge_host_ranges(in, kPage);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].begin, 0x100000u);
  EXPECT_EQ(out[0].end, 0x140000u);
  EXPECT_EQ(out[0].pes, (std::vector<int>{0, 1, 2, 3}));
}

TEST(StreamRanges, HeapsSharingAPageAreMergedOthersStayApart) {
  const std::vector<HostRange> in = {
      {0x300000, 0x300000 + 5000, {2}},              // far away: its own range
      {0x100000, 0x100000 + 100, {0}},               // ends inside page 0x100000
      {0x100000 + 200, 0x100000 + 8192, {1}},        // starts in that page: merged
      {0x100000 + 8192 + 4096, 0x104000 + 64, {3}},  // a whole page apart: not merged
  };
  const auto out = merge_host_ranges(in, kPage);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].begin, 0x100000u);
  EXPECT_EQ(out[0].end, 0x100000u + 8192);
  EXPECT_EQ(out[0].pes, (std::vector<int>{0, 1}));
  EXPECT_EQ(out[1].begin, 0x100000u + 8192 + 4096);
  EXPECT_EQ(out[1].pes, (std::vector<int>{3}));
  EXPECT_EQ(out[2].begin, 0x300000u);
  EXPECT_EQ(out[2].end, 0x300000u + 5000);
  EXPECT_EQ(out[2].pes, (std::vector<int>{2}));
}

TEST(StreamRanges, OverlappingAndNestedRangesAreCoveredOnce) {
  const std::vector<HostRange> in = {{0x200000, 0x210000, {0}}, {0x204000, 0x208000, {1}}, {0x20f000, 0x220000, {2}}};
  const auto out = merge_host_ranges(in, kPage);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].begin, 0x200000u);
  EXPECT_EQ(out[0].end, 0x220000u);  // the nested range does not shrink it
  EXPECT_EQ(out[0].pes, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(merge_host_ranges({}, kPage).empty());
}

}  // namespace
}  // namespace ubep::detail
