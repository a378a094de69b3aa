// Fuzz target: every UBEP_* value parser (base/options.cpp: Options::from_env and what it calls,
// parse_size, PollPolicy::parse; topology: parse_schedule; moe: parse_dtype, parse_combine).
// Input: one selector byte, then the value(s). Selector < 14: that one variable is set to the rest;
// 14: every line "<byte><value>" sets variable byte % 14 (several at once); 15..: the direct parsers on
// the raw bytes (embedded NULs included, as a std::string from a program may hold them).
// Property: a value parses or throws ubep::Error(invalid_argument) whose message names the variable; on
// success every field holds a documented value, a size equals what an independent reference parser reads
// (digits, one K/M/G/T suffix, powers of 2, no overflow), and describe() read back through from_env gives
// the same Options (the round trip ubep-info and the benchmark headers rely on).
#include <cmath>
#include <cstdlib>
#include <optional>
#include <vector>

#include "fuzz_common.hpp"
#include "ubep/moe.hpp"
#include "ubep/options.hpp"
#include "ubep/topology.hpp"

namespace {

constexpr const char* kVars[] = {
    "UBEP_HEAP_SIZE",       "UBEP_WAIT_TIMEOUT",         "UBEP_POLL",          "UBEP_TRANSPORTS",
    "UBEP_PROGRESS_THREAD", "UBEP_PROGRESS_INTERVAL_US", "UBEP_VIRTUAL_NODES", "UBEP_SCHEDULE",
    "UBEP_TOPOLOGY_FILE",   "UBEP_TOPOLOGY_PROBE",       "UBEP_RUN_AHEAD",     "UBEP_MPI_SIGNAL",
    "UBEP_UCX_MODE",        "UBEP_MPI_BOUNDED",          "UBEP_GPU_HEAP_SIZE", "UBEP_GPU_STAGING_CHUNK",
    "UBEP_GPU_EMULATE",     "UBEP_GPU_MPI_WINDOW",       "UBEP_GPU",           "UBEP_MOE_KERNELS"};
constexpr int kNumVars = sizeof kVars / sizeof kVars[0];

void clear_env() {
  for (const ubep::Setting& row : ubep::settings()) unsetenv(row.name);
}

bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }
std::string trim(std::string s) {
  while (!s.empty() && space(s.back())) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && space(s[i])) ++i;
  return s.substr(i);
}

// The documented size syntax, written independently of base/options.cpp: [spaces] digits [spaces]
// [K|M|G|T] [spaces], the suffix a power of 2 (binary), no "Ki"-style suffix, the value within 64 bits.
std::optional<std::uint64_t> reference_size(const std::string& text) {
  std::string t = trim(text);
  unsigned shift = 0;
  if (!t.empty()) {
    switch (t.back()) {
      case 'k':
      case 'K': shift = 10; break;
      case 'm':
      case 'M': shift = 20; break;
      case 'g':
      case 'G': shift = 30; break;
      case 't':
      case 'T': shift = 40; break;
      default: break;
    }
    if (shift) t.pop_back();
    if (!t.empty() && (t.back() == 'i' || t.back() == 'I')) return std::nullopt;
  }
  t = trim(t);
  if (t.empty()) return std::nullopt;
  unsigned __int128 v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned>(c - '0');
    if (v > ~std::uint64_t{0}) return std::nullopt;
  }
  v <<= shift;
  if (v > ~std::uint64_t{0}) return std::nullopt;
  return static_cast<std::uint64_t>(v);
}

bool one_of(const std::string& s, std::initializer_list<const char*> values) {
  for (const char* v : values)
    if (s == v) return true;
  return false;
}

void check_fields(const ubep::Options& o) {
  UBEP_FUZZ_CHECK(o.heap_size > 0, "heap_size 0");
  UBEP_FUZZ_CHECK(o.gpu_heap_size > 0, "gpu_heap_size 0");
  UBEP_FUZZ_CHECK(std::isfinite(o.wait_timeout.count()) && o.wait_timeout.count() >= 0, "wait_timeout");
  UBEP_FUZZ_CHECK(o.poll.progress_every >= 1, "progress_every 0");
  UBEP_FUZZ_CHECK(!o.transports.empty(), "no transport");
  for (const std::string& t : o.transports) UBEP_FUZZ_CHECK(one_of(t, {"self", "shm", "mpi", "ucx"}), t);
  UBEP_FUZZ_CHECK(o.run_ahead >= 1 && o.run_ahead <= 64, std::to_string(o.run_ahead));
  UBEP_FUZZ_CHECK(o.virtual_nodes == trim(o.virtual_nodes), "virtual_nodes not trimmed");
}

// describe() -> environment -> from_env() must give the same settings.
void check_round_trip(const ubep::Options& o) {
  clear_env();
  for (const std::string& line : o.describe()) {
    const auto eq = line.find('=');
    UBEP_FUZZ_CHECK(eq != std::string::npos, line);
    setenv(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str(), 1);
  }
  ubep::Options b;
  try {
    b = ubep::Options::from_env();
  } catch (const ubep::Error& e) {
    UBEP_FUZZ_CHECK(false, std::string("describe() does not parse back: ") + e.what());
  }
  clear_env();
  // Each setting reads back as itself (F2, fixed: the timeout prints with %.17g, so it reads back exactly).
  for (const ubep::Setting& row : ubep::settings()) {
    UBEP_FUZZ_CHECK(row.value(b) == row.value(o),
                    std::string(row.name) + "='" + row.value(o) + "' read back as '" + row.value(b) + "'");
  }
  UBEP_FUZZ_CHECK(b == o, "describe() read back as other settings");
}

void from_env(const std::vector<std::pair<int, std::string>>& settings) {
  clear_env();
  for (const auto& [var, value] : settings) setenv(kVars[var], value.c_str(), 1);
  ubep::Options o;
  try {
    o = ubep::Options::from_env();
  } catch (const ubep::Error& e) {
    clear_env();
    UBEP_FUZZ_CHECK(e.code() == ubep::Errc::invalid_argument, e.what());
    // One variable set: the message names it; several: it names one of them.
    ubep::fuzz::check_message(e, settings.size() == 1 ? kVars[settings[0].first] : "UBEP_");
    return;
  }
  check_fields(o);
  std::optional<std::string> heap;  // the last UBEP_HEAP_SIZE set wins
  for (const auto& [var, value] : settings)
    if (var == 0) heap = value.c_str();  // what the environment holds (up to a NUL)
  if (heap && !heap->empty()) {
    const auto want = reference_size(*heap);
    UBEP_FUZZ_CHECK(want && *want == o.heap_size,
                    "UBEP_HEAP_SIZE='" + *heap + "' read as " + std::to_string(o.heap_size));
  }
  check_round_trip(o);
}

void direct(int which, const std::string& text) {
  try {
    switch (which % 5) {
      case 0: {
        // Finding F1 (docs/reliability/fuzz.md, fixed): an embedded NUL ("12\0junk") is rejected.
        const std::size_t v = ubep::parse_size(text, "size");
        const auto want = reference_size(text);
        UBEP_FUZZ_CHECK(want && *want == v, "parse_size('" + text + "') = " + std::to_string(v));
        break;
      }
      case 1: {
        const ubep::PollPolicy p = ubep::PollPolicy::parse(text);
        UBEP_FUZZ_CHECK(p.progress_every >= 1, "progress_every 0");
        break;
      }
      case 2: (void)ubep::parse_schedule(text); break;
      case 3: {
        const ubep::moe::DType t = ubep::moe::parse_dtype(text);
        UBEP_FUZZ_CHECK(ubep::moe::parse_dtype(ubep::moe::to_string(t)) == t, "dtype round trip");
        break;
      }
      case 4: {
        const ubep::moe::Combine c = ubep::moe::parse_combine(text);
        UBEP_FUZZ_CHECK(ubep::moe::parse_combine(ubep::moe::to_string(c)) == c, "combine round trip");
        break;
      }
    }
  } catch (const ubep::Error& e) {
    UBEP_FUZZ_CHECK(e.code() == ubep::Errc::invalid_argument, e.what());
    if (which % 5 == 0) {
      UBEP_FUZZ_CHECK(!reference_size(text), "parse_size rejects '" + text + "': " + e.what());
      ubep::fuzz::check_message(e, "size");
    } else {
      ubep::fuzz::check_message(e, which % 5 == 1 ? "UBEP_POLL" : which % 5 == 2 ? "UBEP_SCHEDULE" : "moe");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ubep::fuzz::Bytes in(data, size);
  const int mode = in.u8();
  if (mode < kNumVars) {
    from_env({{mode, in.rest()}});
  } else if (mode == kNumVars) {
    std::vector<std::pair<int, std::string>> settings;
    while (!in.empty() && settings.size() < 2 * kNumVars) {
      const int var = in.u8() % kNumVars;
      settings.emplace_back(var, in.text(256, '\n'));
    }
    from_env(settings);
  } else {
    direct(mode - kNumVars - 1, in.rest());
  }
  return 0;
}
