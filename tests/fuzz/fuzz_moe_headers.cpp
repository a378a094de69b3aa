// Fuzz target: the MoE layer's checks of what a source writes ahead of its tokens (moe/wire.hpp): a per_expert
// region header and a load/store source's gathered rows, a per_rank/per_node chunk header and its records, a relay's
// inbox header (issue 34, "The wire is input"). Input: the buffer geometry (capacity, rows, ranks, signals, row bytes,
// local experts), then the header words and record entries. Property: a header that passes only names rows, offsets,
// ranks, signals and experts that exist: what the layer then reads and writes is replayed on buffers of exactly that
// size (ASan sees any byte outside). A rejection names a field.
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "moe/wire.hpp"

namespace {
namespace wire = ubep::moe::wire;
using ubep::moe::DdEntry;

void expect_field(const std::string& why) {
  UBEP_FUZZ_CHECK(why.rfind("field '", 0) == 0, "a rejection that names no field: " + why);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ubep::fuzz::Bytes in(data, size);
  const auto u64 = [&] {
    return in.u8() % 4 == 0 ? in.u32() | (static_cast<std::uint64_t>(in.u32()) << 32) : in.u16();
  };
  const std::uint64_t capacity = in.u16() % 512, rows = in.u16() % 512, ranks = in.u8() % 64 + 1,
                      signals = in.u16() % 1024 + 1, row_bytes = in.u8() % 64 + 1, max_records = in.u16() % 256;
  const int local = in.u8() % 16 + 1, me = static_cast<int>(in.u8() % ranks);
  const std::uint8_t which = in.u8() % 3;
  if (which == 0) {  // Layer's region: experts 0..upto
    const int upto = in.u8() % local;
    std::vector<std::uint64_t> header(2 * static_cast<std::size_t>(local));
    for (auto& w : header) w = u64();
    const std::string why = wire::check_region_header(header.data(), upto, capacity, rows);
    if (!why.empty()) return expect_field(why), 0;
    std::vector<std::uint8_t> region(capacity), cbuf(rows);
    std::uint64_t first = 0;
    for (int e = 0; e <= upto; ++e) {
      const std::uint64_t n = header[2 * e], at = header[2 * e + 1];
      if (n) std::memset(region.data() + first, 1, n);  // regroup reads [first, first + n) of the region
      if (n) std::memset(cbuf.data() + at, 2, n);       // combine writes [at, at + n) of the source's rows
      first += n;
    }
    // A load/store source lists, per expert, rows of its staged tokens (`rows` of them) the owner then gathers.
    std::vector<std::uint32_t> listed(in.u8() % 32);
    for (auto& r : listed) r = in.u8() % 4 == 0 ? in.u32() : in.u16() % 512;
    const std::string rows_why = wire::check_gathered_rows(listed.data(), listed.size(), rows);
    if (!rows_why.empty()) return expect_field(rows_why), 0;
    std::vector<std::uint8_t> staged(rows);
    for (const std::uint32_t r : listed) staged[r] = 3;  // the gather reads row r (ASan sees a row past the end)
  } else if (which == 1) {                               // a chunk at its owner, and its records
    const std::uint64_t h[4] = {u64(), u64(), u64(), u64()};
    const std::uint64_t rbuf_bytes = rows * row_bytes;
    const std::string why = wire::check_chunk_header(h, max_records, ranks, signals, rbuf_bytes, row_bytes);
    if (!why.empty()) return expect_field(why), 0;
    std::vector<std::uint8_t> rbuf(rbuf_bytes), sig(signals), rank(ranks);
    if (h[0]) std::memset(rbuf.data() + h[2], 3, h[0] * row_bytes);  // the reply's rows
    sig[h[3]] = 1;
    rank[h[1]] = 1;
    const std::uint64_t max_m = in.u8() % 9 + 1;
    for (std::uint64_t j = 0; j < h[0] && !in.empty(); ++j) {
      const std::uint32_t m = in.u8() % 12;
      std::vector<DdEntry> e(m);
      for (auto& x : e)
        x = {in.u8() % 2 ? me : static_cast<std::int32_t>(in.u32()), static_cast<std::int32_t>(in.u8() % 20) - 2, 0.5f};
      std::string w = wire::check_record_count(m, max_m);
      if (w.empty()) w = wire::check_record_entries(e.data(), m, me, local);
      if (!w.empty()) return expect_field(w), 0;
      std::vector<int> per_expert(local);
      for (const DdEntry& x : e) ++per_expert.at(x.le);  // the owner's batch of that expert
    }
  } else {  // a relay's inbox
    const std::uint64_t h[2] = {u64(), u64()};
    const std::uint64_t rbuf_bytes = rows * row_bytes;
    const std::string why = wire::check_inbox_header(h, max_records, rbuf_bytes, row_bytes);
    if (!why.empty()) return expect_field(why), 0;
    std::vector<std::uint8_t> rbuf(rbuf_bytes);
    if (h[0]) std::memset(rbuf.data() + h[1], 4, h[0] * row_bytes);  // the node's rows land here
  }
  return 0;
}
