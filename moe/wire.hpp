// What a source writes into an owner's (or a relay's) buffers ahead of its tokens, and the checks the receiver runs
// before it reads a byte behind it. A peer is untrusted input (docs/RELIABILITY.md, "Trust"): every count, offset and
// expert id is checked against what the receiver's buffers hold, with no arithmetic that can wrap, and a violation is
// Errc::protocol naming the source and the field (tests/fuzz/fuzz_moe_headers.cpp drives these checks with
// arbitrary values). Each returns an empty string when the header passes, else what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "moe/handle.hpp"

namespace ubep::moe::wire {

namespace detail {
inline std::string field(const char* name, std::uint64_t value, const std::string& why) {
  return std::string("field '") + name + "' = " + std::to_string(value) + ": " + why;
}
}  // namespace detail

/// Layer's region of one source (per_expert): per local expert e, header[2e] tokens and header[2e+1] the offset of
/// their outputs in the source's combine rows. Checks experts 0..upto (those whose signals arrived): their tokens
/// together fit the region's `capacity` rows, and each expert's outputs [offset, offset + tokens) fit the `rows` of
/// one set of the source's combine buffer.
inline std::string check_region_header(const std::uint64_t* header, int upto, std::uint64_t capacity,
                                       std::uint64_t rows) {
  std::uint64_t used = 0;
  for (int e = 0; e <= upto; ++e) {
    const std::uint64_t n = header[2 * e], at = header[2 * e + 1];
    if (n > capacity - used) {
      return detail::field("tokens", n,
                           "local expert " + std::to_string(e) + "'s tokens overflow the region (" +
                               std::to_string(used) + " of " + std::to_string(capacity) + " rows taken)");
    }
    used += n;
    if (at > rows || n > rows - at) {
      return detail::field("offset", at,
                           "local expert " + std::to_string(e) + "'s " + std::to_string(n) +
                               " outputs fall outside the source's " + std::to_string(rows) + " combine rows");
    }
  }
  return {};
}

/// The rows a load/store source lists for one expert (per_expert): the j-th token of the batch is row rows[j] of
/// the source's staged tokens, which hold `staged` rows (max_tokens_per_rank). Each of the `count` rows must be one.
inline std::string check_gathered_rows(const std::uint32_t* rows, std::uint64_t count, std::uint64_t staged) {
  for (std::uint64_t j = 0; j < count; ++j) {
    if (rows[j] >= staged) {
      return detail::field("row", rows[j],
                           "token " + std::to_string(j) + " of the batch is past the source's " +
                               std::to_string(staged) + " staged tokens (max_tokens_per_rank)");
    }
  }
  return {};
}

/// A per_rank/per_node chunk at its owner: {records, reply rank, reply byte offset in the reply rank's row buffer,
/// reply signal index}. The records fit the chunk (`max_records`), the reply rank is a rank, the signal an index of
/// the signal array, and the records' rows [offset, offset + records * row_bytes) fit the `rbuf_bytes`-byte row
/// buffer.
inline std::string check_chunk_header(const std::uint64_t* h, std::uint64_t max_records, std::uint64_t ranks,
                                      std::uint64_t signals, std::uint64_t rbuf_bytes, std::uint64_t row_bytes) {
  if (h[0] > max_records) {
    return detail::field("records", h[0], "more than a chunk holds (" + std::to_string(max_records) + ")");
  }
  if (h[1] >= ranks) return detail::field("reply rank", h[1], "not a rank of " + std::to_string(ranks));
  if (h[3] >= signals) return detail::field("reply signal", h[3], "not one of " + std::to_string(signals) + " signals");
  if (h[2] > rbuf_bytes || h[0] * row_bytes > rbuf_bytes - h[2]) {
    return detail::field("reply offset", h[2],
                         std::to_string(h[0]) + " rows of " + std::to_string(row_bytes) + " bytes fall outside the " +
                             std::to_string(rbuf_bytes) + "-byte row buffer");
  }
  return {};
}

/// A relay's inbox: {records, byte offset of the node's rows in this relay's row buffer}.
inline std::string check_inbox_header(const std::uint64_t* h, std::uint64_t max_records, std::uint64_t rbuf_bytes,
                                      std::uint64_t row_bytes) {
  if (h[0] > max_records) {
    return detail::field("records", h[0], "more than an inbox holds (" + std::to_string(max_records) + ")");
  }
  if (h[1] > rbuf_bytes || h[0] * row_bytes > rbuf_bytes - h[1]) {
    return detail::field("reply offset", h[1],
                         std::to_string(h[0]) + " rows of " + std::to_string(row_bytes) + " bytes fall outside the " +
                             std::to_string(rbuf_bytes) + "-byte row buffer");
  }
  return {};
}

/// A record's expert count: 1..max_m.
inline std::string check_record_count(std::uint32_t m, std::uint64_t max_m) {
  if (m == 0 || m > max_m) return detail::field("experts", m, "a record names 1.." + std::to_string(max_m));
  return {};
}

/// A record's entries at their owner `me`, which holds `local` experts: each names `me` and one of its experts.
inline std::string check_record_entries(const DdEntry* e, std::uint32_t m, int me, int local) {
  for (std::uint32_t i = 0; i < m; ++i) {
    if (e[i].owner != me) return detail::field("owner", static_cast<std::uint32_t>(e[i].owner), "not this rank");
    if (e[i].le < 0 || e[i].le >= local) {
      return detail::field("local expert", static_cast<std::uint32_t>(e[i].le),
                           "not one of this rank's " + std::to_string(local) + " experts");
    }
  }
  return {};
}

}  // namespace ubep::moe::wire
