// The vector row kernels (moe/kernels.hpp), written once with GCC's vector extensions for UBEP_SIMD_FLOATS
// floats per vector, and compiled once per instruction set by a file that sets the width and is built for
// that set (kernels_avx2.cpp with -mavx2, kernels_avx512.cpp with -mavx512f); kernels.cpp picks one at run
// time. Included by those files only.
//
// Per element they do what the portable loops do, in the same order: a multiplication, then an addition
// (moe/ is built with -ffp-contract=off, so nothing is fused into an FMA); the tail of a row (fewer elements
// than a vector) runs the portable element code. Loads and stores are unaligned (memcpy): rows start anywhere.
#pragma once

#include <cstring>

#include "moe/row_kernels.hpp"

#if !defined(UBEP_SIMD_FLOATS) || !defined(UBEP_SIMD_KERNELS) || !defined(UBEP_SIMD_NAME)
#error "define UBEP_SIMD_FLOATS (floats per vector), UBEP_SIMD_KERNELS and UBEP_SIMD_NAME before this header"
#endif

namespace ubep::moe::simd {
namespace {

constexpr std::size_t W = UBEP_SIMD_FLOATS;
typedef float vf __attribute__((vector_size(W * 4)));
typedef std::uint32_t vu __attribute__((vector_size(W * 4)));
typedef std::uint16_t vh __attribute__((vector_size(W * 2)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void put(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
/// W bf16 values as floats (exact: the bits moved up by 16).
inline vf widen(const std::uint16_t* p) {
  vh h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<vf>(__builtin_convertvector(h, vu) << 16);
}
inline vf widen(vh h) { return reinterpret_cast<vf>(__builtin_convertvector(h, vu) << 16); }
/// bf16 bits of W floats: round to nearest even, a NaN kept and made quiet (float_to_bf16_bits).
inline vh narrow(vf f) {
  const vu u = reinterpret_cast<vu>(f);
  const auto nan = (u & 0x7fffffffu) > 0x7f800000u;
  const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const vu quiet = (u >> 16) | 0x40u;
  return __builtin_convertvector(nan ? quiet : rounded, vh);
}

void madd_bf16(float* acc, const std::uint16_t* v, std::size_t n, float w, bool first) {
  const vf zero{};
  std::size_t i = 0;
  if (first) {
    for (; i + W <= n; i += W) put(acc + i, zero + w * widen(v + i));
    for (; i < n; ++i) acc[i] = 0.0f + w * bf16_bits_to_float(v[i]);
  } else {
    for (; i + W <= n; i += W) put(acc + i, load(acc + i) + w * widen(v + i));
    for (; i < n; ++i) acc[i] += w * bf16_bits_to_float(v[i]);
  }
}
void madd_f32(float* acc, const float* v, std::size_t n, float w, bool first) {
  const vf zero{};
  std::size_t i = 0;
  if (first) {
    for (; i + W <= n; i += W) put(acc + i, zero + w * load(v + i));
    for (; i < n; ++i) acc[i] = 0.0f + w * v[i];
  } else {
    for (; i + W <= n; i += W) put(acc + i, load(acc + i) + w * load(v + i));
    for (; i < n; ++i) acc[i] += w * v[i];
  }
}
void add_bf16(float* acc, const std::uint16_t* v, std::size_t n, bool first) {
  std::size_t i = 0;
  for (; i + W <= n; i += W) put(acc + i, (first ? vf{} : load(acc + i)) + widen(v + i));
  for (; i < n; ++i) acc[i] = (first ? 0.0f : acc[i]) + bf16_bits_to_float(v[i]);
}
void add_f32(float* acc, const float* v, std::size_t n, bool first) {
  std::size_t i = 0;
  for (; i + W <= n; i += W) put(acc + i, (first ? vf{} : load(acc + i)) + load(v + i));
  for (; i < n; ++i) acc[i] = (first ? 0.0f : acc[i]) + v[i];
}
void store_bf16(const float* acc, std::uint16_t* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + W <= n; i += W) {
    const vh h = narrow(load(acc + i));
    std::memcpy(d + i, &h, sizeof h);
  }
  for (; i < n; ++i) d[i] = float_to_bf16_bits(acc[i]);
}
void add_rounded(float* o, const float* ns, std::size_t n) {
  std::size_t i = 0;
  for (; i + W <= n; i += W) put(o + i, load(o + i) + widen(narrow(load(ns + i))));
  for (; i < n; ++i) o[i] += bf16_bits_to_float(float_to_bf16_bits(ns[i]));
}

/// This width's set (in this file's anonymous namespace, like everything here: the two files that include it
/// are built for different instruction sets, and must share no function).
constexpr RowKernels kKernels{UBEP_SIMD_NAME, madd_bf16, madd_f32, add_bf16, add_f32, store_bf16, add_rounded};

}  // namespace
}  // namespace ubep::moe::simd

namespace ubep::moe {
/// The one function the including file exports (declared in moe/row_kernels.hpp).
const RowKernels& UBEP_SIMD_KERNELS() noexcept { return simd::kKernels; }
}  // namespace ubep::moe
