// The start of every check of label gpu: without a GPU, one line saying why and the exit code (77: CTest skips
// the test; 1 under UBEP_REQUIRE_GPU=1, where a missing GPU is a failure).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "ubep/gpu.hpp"

namespace ubep::test {

/// The exit code when this process has no usable GPU (after printing the reason), nothing when it has one
/// (after printing gpu_status()'s line).
inline std::optional<int> exit_without_gpu() {
  const GpuStatus& s = gpu_status();
  if (s.available) {
    std::printf("%s\n", s.reason.c_str());
    return std::nullopt;
  }
  const char* require = std::getenv("UBEP_REQUIRE_GPU");
  const bool required = require && std::strcmp(require, "1") == 0;
  std::printf("%s: %s\n", required ? "FAIL (UBEP_REQUIRE_GPU=1)" : "skipped", s.reason.c_str());
  return required ? 1 : 77;
}

}  // namespace ubep::test
