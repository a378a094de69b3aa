// The voice of ubep: every error message and warning starts "ubep: rank R: call: ", so a line in a
// 1000-rank job's output says who printed it and where.
#pragma once

#include <string>

namespace ubep::detail {

/// "ubep: rank R: call: ".
std::string message_prefix(int rank, const char* call);
/// Prints "ubep: rank R: call: what" on stderr (one write, so lines of ranks do not interleave). Never throws.
void warn(int rank, const char* call, const std::string& what) noexcept;

}  // namespace ubep::detail
