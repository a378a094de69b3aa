// Helpers shared by the fuzz targets (tests/fuzz): the invariant check and a reader of the fuzzer's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ubep/error.hpp"

namespace ubep::fuzz {

/// A broken invariant is a finding: print what broke and abort, so libFuzzer saves the input.
[[noreturn]] inline void fail(const char* file, int line, const char* cond, const std::string& detail) {
  std::fprintf(stderr, "ubep fuzz: invariant broken at %s:%d: %s\n  %s\n", file, line, cond, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

#define UBEP_FUZZ_CHECK(cond, detail)                                                \
  do {                                                                               \
    if (!(cond)) ::ubep::fuzz::fail(__FILE__, __LINE__, #cond, std::string(detail)); \
  } while (0)

/// Checks that an Error's message starts with "ubep: " and contains `needle` (the variable, file or call it
/// is about), so every rejection tells the user what was wrong.
inline void check_message(const ubep::Error& e, std::string_view needle) {
  const std::string what = e.what();
  UBEP_FUZZ_CHECK(what.rfind("ubep: ", 0) == 0, "message does not start with 'ubep: ': " + what);
  UBEP_FUZZ_CHECK(what.find(needle) != std::string::npos,
                  "message does not name '" + std::string(needle) + "': " + what);
}

/// Takes the fuzzer's bytes front to back: fixed-size numbers first, the rest as text.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return u16() | (static_cast<std::uint32_t>(u16()) << 16); }
  bool empty() const noexcept { return n_ == 0; }
  /// Up to `max` bytes as a string, ending at (and consuming) the first `sep`.
  std::string text(std::size_t max, char sep) {
    std::string out;
    while (n_ > 0 && out.size() < max) {
      const char c = static_cast<char>(u8());
      if (c == sep) break;
      out += c;
    }
    return out;
  }
  std::string rest() {
    std::string out(reinterpret_cast<const char*>(p_), n_);
    p_ += n_;
    n_ = 0;
    return out;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

}  // namespace ubep::fuzz
