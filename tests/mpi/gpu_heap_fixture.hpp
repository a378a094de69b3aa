// The fixture of the tests that run on the GPU heap twice (tests/mpi/gpu_heap_test.cpp,
// tests/mpi/moe_device_test.cpp): on a heap EMULATED in host memory (UBEP_GPU_EMULATE: every route and rank count,
// on any machine) and on a real GPU (skipped unless every rank has one).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "tests/mpi/test_util.hpp"
#include "ubep/config.hpp"
#include "ubep/ubep.hpp"

#if UBEP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ubep::test {

/// Every rank has a usable GPU (collective).
inline bool gpu_everywhere() { return all_ranks(gpu_status().available); }

enum class Heap { emulated, cuda };

class GpuHeapFixture : public ::testing::TestWithParam<Heap> {
 protected:
  void SetUp() override {
    if (GetParam() == Heap::cuda && !gpu_everywhere()) GTEST_SKIP() << "no GPU: " << gpu_status().reason;
  }
  /// `base` with the GPU heap of this parameter: `gpu_heap_bytes`, emulated or not.
  Options with_gpu_heap(Options base, std::size_t gpu_heap_bytes) const {
    base.gpu_heap_size = gpu_heap_bytes;
    base.gpu_emulate = GetParam() == Heap::emulated;
    return base;
  }
  /// The test's own copy between GPU memory and host memory, outside ubep: cudaMemcpy on a GPU, memcpy where
  /// the heap is emulated in host memory.
  void copy_raw(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
    if (GetParam() == Heap::emulated) {
      std::memcpy(dst, src, bytes);
      return;
    }
#if UBEP_HAVE_CUDA
    ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), cudaSuccess);
#else
    FAIL() << "a CUDA heap in a build without CUDA";
#endif
  }
};

/// The parameter's name in test names: emulated, cuda.
inline std::string heap_name(const ::testing::TestParamInfo<Heap>& p) {
  return p.param == Heap::emulated ? "emulated" : "cuda";
}

}  // namespace ubep::test
