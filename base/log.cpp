#include "base/log.hpp"

#include <cstdio>

namespace ubep::detail {

std::string message_prefix(int rank, const char* call) {
  return "ubep: rank " + std::to_string(rank) + ": " + call + ": ";
}

void warn(int rank, const char* call, const std::string& what) noexcept {
  try {
    const std::string line = message_prefix(rank, call) + what + "\n";
    std::fputs(line.c_str(), stderr);
  } catch (...) {
    std::fputs("ubep: warning (out of memory while formatting it)\n", stderr);
  }
}

}  // namespace ubep::detail
