// The avx2 row kernels: moe/kernels_simd.hpp at 8 floats per vector, this file built with -mavx2 (and only
// run where the CPU reports AVX2: kernels.cpp).
#define UBEP_SIMD_FLOATS 8
#define UBEP_SIMD_KERNELS avx2_kernels
#define UBEP_SIMD_NAME "avx2"
#include "moe/kernels_simd.hpp"
