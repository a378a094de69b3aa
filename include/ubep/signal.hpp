/// \file signal.hpp
/// The vocabulary of signals and waits: what a signal update does (SignalOp), the condition a wait
/// applies (Cmp, compare), and the per-call settings of a wait (WaitOptions). The calls are Context's
/// (context.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>

namespace ubep {

/// What a signal update does to the 64-bit signal word.
enum class SignalOp : std::uint8_t { set, add };
/// The comparison a wait applies: `signal <cmp> value`.
enum class Cmp : std::uint8_t { eq, ne, gt, ge, lt, le };
const char* to_string(SignalOp op) noexcept;
const char* to_string(Cmp cmp) noexcept;

/// In the per-signal value forms of wait_until_all/any/some, a value of kSignalIgnored leaves that signal
/// out of the wait: it is neither required (all) nor returned (any, some), nor named in a timeout report.
inline constexpr std::uint64_t kSignalIgnored = ~std::uint64_t{0};

/// Per-call settings of a wait.
struct WaitOptions {
  /// Deadline for this wait; unset = Options::wait_timeout (UBEP_WAIT_TIMEOUT).
  std::optional<std::chrono::duration<double>> timeout{};
  /// The ranks expected to write the signals, for the timeout report: one rank for all signals, or one
  /// rank per signal (same length as the signal set). Empty = unknown; -1 = unknown for that signal; any
  /// other value outside [0, size) throws Errc::out_of_range.
  std::span<const int> writers{};
  /// A name for the report ("moe dispatch counts", ...). May be null.
  const char* what = nullptr;
};

/// True when `*sig <cmp> value`.
constexpr bool compare(std::uint64_t sig, Cmp cmp, std::uint64_t value) noexcept {
  switch (cmp) {
    case Cmp::eq: return sig == value;
    case Cmp::ne: return sig != value;
    case Cmp::gt: return sig > value;
    case Cmp::ge: return sig >= value;
    case Cmp::lt: return sig < value;
    case Cmp::le: return sig <= value;
  }
  return false;
}

}  // namespace ubep
