// The element loops of the MoE row kernels (moe/kernels.hpp), in a header of their own that includes nothing
// of ubep or MPI: kernels_avx2.cpp and kernels_avx512.cpp, built for other instruction sets, include only
// this, so that no inline or template function they compile (MPI's C++ bindings, say) can be the one copy
// the linker keeps for the whole library.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ubep::moe {

// These two are static (one copy per file), and use the builtin rather than std::bit_cast (a template whose
// instantiation an unoptimized build emits as a shared weak symbol): kernels_avx2.cpp and kernels_avx512.cpp
// are built for other instruction sets, and an inline function's one shared copy could come from either.
/// bfloat16 bits to float, inline: the exported bf16_to_float would be a PLT call per element.
static inline float bf16_bits_to_float(std::uint16_t b) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(b) << 16);
}
/// float to bfloat16 bits, round to nearest even (NaN stays NaN), inline for the same reason.
static inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = __builtin_bit_cast(std::uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// The element loops every reduction of moe/kernels.hpp is built from, one set per instruction set. Every set computes
/// each element with the same float operations in the same order (a multiplication, then an addition; never
/// a fused multiply-add: moe/ is built with -ffp-contract=off), so all sets give bit-identical results.
/// bf16 rows are widened exactly (bits << 16) and rounded to nearest even, NaN kept quiet, as
/// float_to_bf16_bits. The x86 sets (kernels_simd.hpp) are chosen at run time from what the CPU reports;
/// AVX-512's BF16 conversion (VCVTNEPS2BF16) is not used: it flushes denormal inputs to zero, so its
/// rounding differs from the portable one (2110 of 542,000 sampled floats on this machine's CPU).
struct RowKernels {
  const char* name;
  /// acc[i] = 0 + w * v[i] (first) or acc[i] += w * v[i], i < n; v bf16 bits or floats.
  void (*madd_bf16)(float* acc, const std::uint16_t* v, std::size_t n, float w, bool first);
  void (*madd_f32)(float* acc, const float* v, std::size_t n, float w, bool first);
  /// acc[i] = 0 + v[i] (first) or acc[i] += v[i].
  void (*add_bf16)(float* acc, const std::uint16_t* v, std::size_t n, bool first);
  void (*add_f32)(float* acc, const float* v, std::size_t n, bool first);
  /// d[i] = bf16(acc[i]), round to nearest even.
  void (*store_bf16)(const float* acc, std::uint16_t* d, std::size_t n);
  /// o[i] += float(bf16(ns[i])): a node's sum rounded to the row type, then added.
  void (*add_rounded)(float* o, const float* ns, std::size_t n);
};

#if UBEP_MOE_X86_KERNELS
/// kernels_avx2.cpp, kernels_avx512.cpp: the sets, built for those instruction sets (call only where supported).
const RowKernels& avx2_kernels() noexcept;
const RowKernels& avx512_kernels() noexcept;
#endif

}  // namespace ubep::moe
