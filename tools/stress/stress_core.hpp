// ubep-stress: the pieces every part of the soak tool shares: a seeded generator, the keyed byte patterns
// that every write and get is checked against, the latency histograms and the mismatch log.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace ubep::stress {

// ---- deterministic randomness -------------------------------------------------------------------------

constexpr std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// A key folding any number of values: key({seed, round, writer, ...}).
inline std::uint64_t key(std::initializer_list<std::uint64_t> parts) noexcept {
  std::uint64_t h = 0x243F6A8885A308D3ULL;
  for (std::uint64_t p : parts) h = mix(h ^ mix(p));
  return h;
}

/// splitmix64 stream: the same seed gives the same sequence on every rank and build (no std distributions,
/// whose results differ between standard libraries).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() noexcept { return mix(s_ += 0x9E3779B97F4A7C15ULL); }
  /// In [0, n), n > 0 (the modulo bias is below 2^-40 for the small n used here).
  std::uint64_t below(std::uint64_t n) noexcept { return next() % n; }
  /// Uniform in [lo, hi].
  std::uint64_t range(std::uint64_t lo, std::uint64_t hi) noexcept { return lo + below(hi - lo + 1); }
  /// True with probability p.
  bool chance(double p) noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Log-uniform in [lo, hi] (as many 1-byte as 16 KiB sizes per octave): small and large sizes alike.
  std::size_t log_size(std::size_t lo, std::size_t hi) noexcept {
    const double a = std::log2(static_cast<double>(lo)), b = std::log2(static_cast<double>(hi) + 1.0);
    const auto v = static_cast<std::size_t>(std::exp2(a + uniform() * (b - a)));
    return std::clamp(v, lo, hi);
  }

 private:
  std::uint64_t s_;
};

// ---- keyed patterns -----------------------------------------------------------------------------------
// The byte at position p of a region written under key K is byte (p mod 8) of mix(K ^ p / 8). K folds the
// seed, the writer, the target and the round (or epoch): a block that is stale (an older round), misplaced
// (another offset), from another writer or torn (half old, half new) differs from what the reader
// regenerates. Every 8-byte word is in effect a checksum of (writer, target, round, position).

inline std::uint8_t pattern_byte(std::uint64_t k, std::size_t p) noexcept {
  return static_cast<std::uint8_t>(mix(k ^ (p >> 3)) >> ((p & 7) * 8));
}

/// Writes the pattern of key k for positions [pos, pos + n) to dst.
inline void fill_pattern(std::uint64_t k, std::size_t pos, std::byte* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  while (i < n && ((pos + i) & 7) != 0) {
    dst[i] = static_cast<std::byte>(pattern_byte(k, pos + i));
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t w = mix(k ^ ((pos + i) >> 3));
    std::memcpy(dst + i, &w, 8);
  }
  for (; i < n; ++i) dst[i] = static_cast<std::byte>(pattern_byte(k, pos + i));
}

/// The first position in [pos, pos + n) whose byte in src differs from the pattern, or n when none.
inline std::size_t first_mismatch(std::uint64_t k, std::size_t pos, const std::byte* src, std::size_t n) noexcept {
  std::size_t i = 0;
  while (i < n && ((pos + i) & 7) != 0) {
    if (src[i] != static_cast<std::byte>(pattern_byte(k, pos + i))) return i;
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t w = mix(k ^ ((pos + i) >> 3));
    std::uint64_t got;
    std::memcpy(&got, src + i, 8);
    if (got != w) {
      for (std::size_t j = 0; j < 8; ++j)
        if (src[i + j] != static_cast<std::byte>(pattern_byte(k, pos + i + j))) return i + j;
    }
  }
  for (; i < n; ++i)
    if (src[i] != static_cast<std::byte>(pattern_byte(k, pos + i))) return i;
  return n;
}

/// Bytes of [pos, pos + n) that match the pattern (for the diagnosis of a mismatch).
inline std::size_t matching_bytes(std::uint64_t k, std::size_t pos, const std::byte* src, std::size_t n) noexcept {
  std::size_t m = 0;
  for (std::size_t i = 0; i < n; ++i) m += src[i] == static_cast<std::byte>(pattern_byte(k, pos + i));
  return m;
}

// ---- latencies ----------------------------------------------------------------------------------------

/// Every ubep call the tool times, one histogram each.
enum class Op : int {
  put,
  put_nbi,
  put_signal,
  put_signal_nbi,
  signal_op,
  get,
  get_nbi,
  atomic_fetch_add,
  atomic_add,
  atomic_compare_swap,
  atomic_swap,
  atomic_fetch,
  atomic_set,
  fence,
  quiet,
  flush,
  flush_local,
  progress,
  test,
  test_all,
  test_any,
  test_some,
  wait_until,
  wait_until_all,
  wait_until_any,
  wait_until_some,
  barrier,
  moe_dispatch_send,
  moe_dispatch_recv,
  moe_next_expert,
  moe_combine_send,
  moe_combine_recv,
  moe_combine,
  moe_progress,
  bsp_layer_call,
  count_
};
constexpr int kOps = static_cast<int>(Op::count_);
inline const char* to_string(Op op) noexcept {
  static constexpr const char* names[] = {"put",
                                          "put_nbi",
                                          "put_signal",
                                          "put_signal_nbi",
                                          "signal_op",
                                          "get",
                                          "get_nbi",
                                          "fetch_add",
                                          "add",
                                          "compare_swap",
                                          "swap",
                                          "fetch",
                                          "set",
                                          "fence",
                                          "quiet",
                                          "flush",
                                          "flush_local",
                                          "progress",
                                          "test",
                                          "test_all",
                                          "test_any",
                                          "test_some",
                                          "wait_until",
                                          "wait_until_all",
                                          "wait_until_any",
                                          "wait_until_some",
                                          "barrier",
                                          "moe.dispatch_send",
                                          "moe.dispatch_recv",
                                          "moe.next_expert",
                                          "moe.combine_send",
                                          "moe.combine_recv",
                                          "moe.combine",
                                          "moe.progress",
                                          "bsp.call"};
  static_assert(std::size(names) == kOps);
  return names[static_cast<int>(op)];
}

/// Log-linear histogram of nanoseconds: 16 buckets per power of two (bucket width <= 6.25 % of its
/// value), exact count and max.
struct Hist {
  static constexpr int kSub = 16, kBuckets = 64 * kSub;
  std::array<std::uint64_t, kBuckets> counts{};
  std::uint64_t n = 0, max_ns = 0;
  static int bucket(std::uint64_t ns) noexcept {
    if (ns < kSub) return static_cast<int>(ns);
    const int e = 63 - __builtin_clzll(ns);  // ns in [2^e, 2^(e+1))
    const int sub = static_cast<int>((ns >> (e - 4)) & (kSub - 1));
    return (e - 3) * kSub + sub;
  }
  /// The upper end of bucket b (the value a percentile reports: never below the true value).
  static std::uint64_t upper(int b) noexcept {
    if (b < kSub) return static_cast<std::uint64_t>(b);
    const int e = b / kSub + 3, sub = b % kSub;
    return ((static_cast<std::uint64_t>(kSub + sub + 1)) << (e - 4)) - 1;
  }
  void add(std::uint64_t ns) noexcept {
    ++counts[bucket(ns)];
    ++n;
    max_ns = std::max(max_ns, ns);
  }
  /// The q-quantile (0 < q <= 1) in ns, as a bucket's upper end, capped by the exact max.
  std::uint64_t quantile(double q) const noexcept {
    if (n == 0) return 0;
    const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(n)));
    std::uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += counts[b];
      if (seen >= std::max<std::uint64_t>(rank, 1)) return std::min(upper(b), max_ns);
    }
    return max_ns;
  }
};

/// Times one ubep call into its histogram.
class Timer {
 public:
  using Clock = std::chrono::steady_clock;
  Timer(std::vector<Hist>& h, Op op) : h_(h), op_(op), t0_(Clock::now()) {}
  ~Timer() {
    h_[static_cast<int>(op_)].add(
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count()));
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  std::vector<Hist>& h_;
  Op op_;
  Clock::time_point t0_;
};

// ---- results ------------------------------------------------------------------------------------------

/// What one rank counted; summed over ranks at the end.
struct Counters {
  std::uint64_t bytes_checked = 0;  // data bytes compared with their expected value (writes, gets, MoE)
  std::uint64_t words_checked = 0;  // signals and counters compared
  std::uint64_t mismatches = 0;
  std::uint64_t first_mismatch_round = ~std::uint64_t{0};
  std::uint64_t moe_calls = 0, moe_tokens = 0, zero_token_calls = 0;
  std::uint64_t delays = 0, stalls = 0, stall_ms = 0, cas_retries = 0, cas_gave_up = 0;
};

/// Reports a mismatch: counted always, printed for the first `print_limit` on this rank.
class Mismatches {
 public:
  Mismatches(Counters& c, int rank, std::uint64_t seed, int print_limit)
      : c_(c), rank_(rank), seed_(seed), limit_(print_limit) {}
  void report(std::uint64_t round, const std::string& what) {
    ++c_.mismatches;
    c_.first_mismatch_round = std::min(c_.first_mismatch_round, round);
    if (printed_++ < limit_) {
      std::fprintf(stderr, "ubep-stress: MISMATCH rank %d round %llu (seed %llu): %s\n", rank_,
                   static_cast<unsigned long long>(round), static_cast<unsigned long long>(seed_), what.c_str());
      std::fflush(stderr);
    }
  }

 private:
  Counters& c_;
  int rank_;
  std::uint64_t seed_;
  int limit_, printed_ = 0;
};

}  // namespace ubep::stress
