// The avx512 row kernels: moe/kernels_simd.hpp at 16 floats per vector, this file built with -mavx512f (and
// only run where the CPU reports AVX-512F: kernels.cpp).
#define UBEP_SIMD_FLOATS 16
#define UBEP_SIMD_KERNELS avx512_kernels
#define UBEP_SIMD_NAME "avx512"
#include "moe/kernels_simd.hpp"
