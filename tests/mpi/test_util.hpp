// Helpers shared by the MPI tests.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

#include "ubep/error.hpp"
#include "ubep/options.hpp"

namespace ubep::test {

/// The options of the environment (UBEP_*), with a heap of `heap_bytes` per rank.
inline Options with_heap(std::size_t heap_bytes) {
  Options o = Options::from_env();
  o.heap_size = heap_bytes;
  return o;
}

/// Expects `fn` to throw ubep::Error with `code` and a message that contains every one of `parts`.
inline void expect_error(Errc code, const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected ubep::Error(" << to_string(code) << "), nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << "got " << to_string(e.code()) << ": " << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

/// A deterministic byte pattern for (rank, index, salt).
inline std::uint8_t pattern(int rank, std::size_t i, unsigned salt = 0) {
  std::uint64_t x = (static_cast<std::uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ULL ^ (i + salt * 7919ULL);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ULL;
  return static_cast<std::uint8_t>(x >> 56);
}

/// All ranks agree that `ok` is true on every rank.
inline bool all_ranks(bool ok, MPI_Comm comm = MPI_COMM_WORLD) {
  int v = ok ? 1 : 0, r = 0;
  MPI_Allreduce(&v, &r, 1, MPI_INT, MPI_MIN, comm);
  return r == 1;
}

}  // namespace ubep::test
