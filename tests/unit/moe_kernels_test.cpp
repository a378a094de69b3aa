// The MoE row kernels (moe/kernels.hpp): every path this CPU runs (avx2, avx512) gives bit for bit what the
// portable loops give, element loop by element loop and through the reductions both layers call, on f32 and
// bf16 rows (e4m3 tokens come back as bf16 outputs), odd lengths, rows at unaligned addresses, and values
// that round differently (ties, denormals, NaN, infinities, -0). And UBEP_MOE_KERNELS picks the path.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moe/kernels.hpp"
#include "ubep/error.hpp"
#include "ubep/moe.hpp"

namespace ubep::moe {
namespace {

constexpr KernelPath kVector[] = {KernelPath::avx2, KernelPath::avx512};

/// Random floats with the cases rounding cares about mixed in.
std::vector<float> values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> v(n);
  const float special[] = {0.0f,
                           -0.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x7f800001u),  // signalling NaN
                           std::bit_cast<float>(0x00009aabu),  // denormal (VCVTNEPS2BF16 flushes it)
                           std::bit_cast<float>(0x80018000u),  // negative denormal, a tie
                           std::bit_cast<float>(0x3f808000u),  // a tie to even (down)
                           std::bit_cast<float>(0x3f818000u),  // a tie to even (up)
                           std::bit_cast<float>(0x7f7fffffu),  // rounds to infinity
                           1e-40f};
  for (std::size_t i = 0; i < n; ++i) v[i] = rng() % 7 == 0 ? special[rng() % std::size(special)] : u(rng);
  return v;
}

std::vector<std::uint16_t> bf16_of(const std::vector<float>& f) {
  std::vector<std::uint16_t> b(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) b[i] = float_to_bf16_bits(f[i]);
  return b;
}

/// Whether a float or bf16 value (by its bits) is a NaN.
bool is_nan(float f) { return f != f; }
bool is_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

/// Bitwise equality, with the first differing element in the message. Two NaNs count as equal: when two NaNs
/// meet in an addition, which payload the result keeps is the compiler's choice of operand order on every path
/// (IEEE 754 leaves it open), the documented exception to bit-identity.
template <class T>
void expect_same_bits(const std::vector<T>& want, const std::vector<T>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0 && !(is_nan(want[i]) && is_nan(got[i]))) {
      std::uint64_t a = 0, b = 0;
      std::memcpy(&a, &want[i], sizeof(T));
      std::memcpy(&b, &got[i], sizeof(T));
      ADD_FAILURE() << what << ": element " << i << " differs from the portable path: " << std::hex << a << " vs " << b;
      return;
    }
  }
}

// First in this file: the environment's choice is read at the first call of the process. ctest runs this
// test again with UBEP_MOE_KERNELS set (tests/CMakeLists.txt).
TEST(MoeKernelsEnv, ChoiceFromEnvironment) {
  const char* env = getenv("UBEP_MOE_KERNELS");
  const std::string asked = env ? env : "";
  if (asked == "bogus") {
    try {
      (void)kernels();
      FAIL() << "UBEP_MOE_KERNELS=bogus was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("UBEP_MOE_KERNELS='bogus'"), std::string::npos) << e.what();
    }
    return;
  }
  if (asked.empty() || asked == "auto") {
    const KernelPath fastest = supported(KernelPath::avx512) ? KernelPath::avx512
                               : supported(KernelPath::avx2) ? KernelPath::avx2
                                                             : KernelPath::portable;
    EXPECT_STREQ(kernels(), to_string(fastest));
    return;
  }
  EXPECT_STREQ(kernels(), asked.c_str());
  EXPECT_EQ(to_string(active_path()), asked);
}

TEST(MoeKernels, PathsThisCpuRuns) {
  EXPECT_TRUE(supported(KernelPath::portable));
#if defined(__x86_64__)
  __builtin_cpu_init();
  EXPECT_EQ(supported(KernelPath::avx2), __builtin_cpu_supports("avx2") != 0);
  EXPECT_EQ(supported(KernelPath::avx512), __builtin_cpu_supports("avx512f") != 0);
#endif
  for (const KernelPath p : kVector) {
    if (!supported(p)) {
      EXPECT_THROW(set_active_path(p), Error);
      std::printf("kernel path %s: not run by this CPU, skipped\n", to_string(p));
    }
  }
}

// Every element loop of every vector path against the portable one: lengths 0..67 and 7168 + 5, each at
// offsets 0..3 elements from an aligned address, first and accumulating.
TEST(MoeKernels, ElementLoopsMatchPortable) {
  const RowKernels& base = row_kernels(KernelPath::portable);
  int checked = 0;
  for (const KernelPath p : kVector) {
    if (!supported(p)) continue;
    const RowKernels& k = row_kernels(p);
    std::vector<std::size_t> lengths;
    for (std::size_t n = 0; n < 68; ++n) lengths.push_back(n);
    lengths.push_back(7173);
    for (const std::size_t n : lengths) {
      for (std::size_t off = 0; off < 4; ++off) {
        const unsigned seed = static_cast<unsigned>(n * 31 + off);
        const std::vector<float> src = values(n + off, seed), acc0 = values(n + off, seed + 1);
        const std::vector<std::uint16_t> src16 = bf16_of(src);
        const std::string at = std::string(to_string(p)) + " n=" + std::to_string(n) + " off=" + std::to_string(off);
        for (const bool first : {true, false}) {
          const std::string f = first ? " first" : " accumulate";
          std::vector<float> a = acc0, b = acc0;
          base.madd_bf16(a.data() + off, src16.data() + off, n, 0.3712f, first);
          k.madd_bf16(b.data() + off, src16.data() + off, n, 0.3712f, first);
          expect_same_bits(a, b, "madd_bf16 " + at + f);
          a = acc0, b = acc0;
          base.madd_f32(a.data() + off, src.data() + off, n, -1.75f, first);
          k.madd_f32(b.data() + off, src.data() + off, n, -1.75f, first);
          expect_same_bits(a, b, "madd_f32 " + at + f);
          a = acc0, b = acc0;
          base.add_bf16(a.data() + off, src16.data() + off, n, first);
          k.add_bf16(b.data() + off, src16.data() + off, n, first);
          expect_same_bits(a, b, "add_bf16 " + at + f);
          a = acc0, b = acc0;
          base.add_f32(a.data() + off, src.data() + off, n, first);
          k.add_f32(b.data() + off, src.data() + off, n, first);
          expect_same_bits(a, b, "add_f32 " + at + f);
        }
        std::vector<std::uint16_t> d1(n + off, 0x1234), d2(n + off, 0x1234);
        base.store_bf16(src.data() + off, d1.data() + off, n);
        k.store_bf16(src.data() + off, d2.data() + off, n);
        expect_same_bits(d1, d2, "store_bf16 " + at);
        std::vector<float> o1 = acc0, o2 = acc0;
        base.add_rounded(o1.data() + off, src.data() + off, n);
        k.add_rounded(o2.data() + off, src.data() + off, n);
        expect_same_bits(o1, o2, "add_rounded " + at);
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU runs no vector path";
}

// store_bf16 on every float bit pattern of a stride through the whole range, against float_to_bf16_bits.
TEST(MoeKernels, RoundingOverTheFloatRange) {
  constexpr std::uint64_t kStride = 65537;  // odd: every low 16-bit pattern appears
  std::vector<float> f;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += kStride)
    f.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  std::vector<std::uint16_t> want(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) want[i] = float_to_bf16_bits(f[i]);
  for (const KernelPath p : {KernelPath::portable, KernelPath::avx2, KernelPath::avx512}) {
    if (!supported(p)) continue;
    std::vector<std::uint16_t> got(f.size());
    row_kernels(p).store_bf16(f.data(), got.data(), f.size());
    expect_same_bits(want, got, std::string("store_bf16 over the range, ") + to_string(p));
  }
}

/// Restores the process's kernel path after a test that forces one.
class ForcedPath {
 public:
  explicit ForcedPath(KernelPath p) : old_(active_path()) { set_active_path(p); }
  ~ForcedPath() { set_active_path(old_); }
  ForcedPath(const ForcedPath&) = delete;
  ForcedPath& operator=(const ForcedPath&) = delete;

 private:
  KernelPath old_;
};

struct Reductions {
  std::vector<float> per_expert, token;
  std::vector<std::byte> partial, node;
};

/// The four reductions of moe/kernels.hpp on one set of rows (hidden odd, rows at unaligned addresses),
/// under the active path.
Reductions reduce_all(bool f32, std::size_t hidden, unsigned seed) {
  const ExpertMap map{8, 4};
  constexpr int kTopk = 3, kTokens = 5;
  const std::size_t eb = f32 ? 4 : 2, row_bytes = hidden * eb;
  std::mt19937 rng(seed);
  // Expert-output rows: slot s at combine + s * row_bytes, with combine one element past an aligned address.
  const std::size_t slots = static_cast<std::size_t>(kTokens) * kTopk;
  std::vector<std::byte> storage((slots + 1) * row_bytes + 64);
  std::byte* combine = storage.data() + eb;
  const std::vector<float> vals = values(slots * hidden, seed);
  for (std::size_t i = 0; i < slots * hidden; ++i) {
    if (f32) {
      std::memcpy(combine + i * 4, &vals[i], 4);
    } else {
      const std::uint16_t b = float_to_bf16_bits(vals[i]);
      std::memcpy(combine + i * 2, &b, 2);
    }
  }
  // Token t's a-th expert: distinct experts; its row is slot t * topk + a.
  std::vector<int> idx, pos;
  std::vector<float> w;
  std::vector<std::size_t> coffset(static_cast<std::size_t>(map.ranks) * map.max_local(), 0);
  for (int t = 0; t < kTokens; ++t) {
    for (int a = 0; a < kTopk; ++a) {
      const int e = (t + 3 * a) % map.num_experts;
      idx.push_back(e);
      pos.push_back(t * kTopk + a);
      w.push_back(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
    }
  }
  Reductions r;
  r.per_expert.assign(static_cast<std::size_t>(kTokens) * hidden, 0.0f);
  reduce_outputs(map, kTopk, idx, w, pos, batches_at(coffset, combine, row_bytes), row_bytes, f32, hidden,
                 r.per_expert);
  std::vector<const std::byte*> y;
  for (int a = 0; a < kTopk; ++a) y.push_back(combine + static_cast<std::size_t>(a) * row_bytes);
  // The partial and node rows one element past an aligned address (rows are element arrays, never byte-shifted).
  r.partial.assign(row_bytes + eb, std::byte{0});
  partial_row(std::span<const float>(w.data(), kTopk), y, f32, hidden, f32, r.partial.data() + eb);
  r.node.assign(row_bytes + eb, std::byte{0});
  node_row(y, f32, hidden, r.node.data() + eb);
  // Three nodes: a relayed row, partial rows rounded (another node), partial rows kept in float.
  const std::vector<const std::byte*> rows_a{y[0], y[1]}, rows_b{y[2]};
  const NodeTerm terms[] = {{y[1], {}, false}, {nullptr, rows_a, true}, {nullptr, rows_b, false}};
  r.token.assign(hidden, 0.0f);
  reduce_token(terms, f32, hidden, r.token.data());
  return r;
}

/// expect_same_bits on two rows of type R (floats or bf16) that start one element into `a` and `b`.
void expect_same_row(const std::vector<std::byte>& a, const std::vector<std::byte>& b, bool f32,
                     const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  auto typed = [&](const std::vector<std::byte>& row, auto zero) {
    std::vector<decltype(zero)> v(row.size() / sizeof(zero) - 1);
    std::memcpy(v.data(), row.data() + sizeof(zero), v.size() * sizeof(zero));
    return v;
  };
  if (f32) {
    expect_same_bits(typed(a, 0.0f), typed(b, 0.0f), what);
  } else {
    expect_same_bits(typed(a, std::uint16_t{0}), typed(b, std::uint16_t{0}), what);
  }
}

TEST(MoeKernels, ReductionsMatchPortable) {
  int checked = 0;
  for (const KernelPath p : kVector) {
    if (!supported(p)) continue;
    for (const bool f32 : {false, true}) {
      for (const std::size_t hidden : {1u, 7u, 15u, 17u, 255u, 257u, 2049u, 7168u}) {
        const unsigned seed = static_cast<unsigned>(hidden) + (f32 ? 1000u : 0u);
        Reductions want, got;
        {
          ForcedPath forced(KernelPath::portable);
          want = reduce_all(f32, hidden, seed);
        }
        {
          ForcedPath forced(p);
          got = reduce_all(f32, hidden, seed);
        }
        const std::string at =
            std::string(to_string(p)) + (f32 ? " f32" : " bf16") + " hidden=" + std::to_string(hidden);
        expect_same_bits(want.per_expert, got.per_expert, "reduce_outputs " + at);
        expect_same_row(want.partial, got.partial, f32, "partial_row " + at);
        expect_same_row(want.node, got.node, f32, "node_row " + at);
        expect_same_bits(want.token, got.token, "reduce_token " + at);
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU runs no vector path";
}

// regroup_tokens, the owner's copy into an expert's batch: a contiguous block (a network source's region) and
// a gathered one (a load/store source's staged tokens, by the rows listed in its region) concatenated in
// source order, each row's payload and the scale after it.
TEST(MoeKernels, RegroupConcatenatesBlocksAndGathersListedRows) {
  constexpr std::size_t kPayload = 6, kStride = 16;
  const auto row = [](int block, int r) { return static_cast<std::byte>(16 * block + r); };
  std::vector<std::byte> contiguous(3 * kStride), staged(5 * kStride);
  for (int r = 0; r < 3; ++r) {
    std::memset(&contiguous[r * kStride], static_cast<int>(row(1, r)), kPayload);
    const float scale = 10.0f + static_cast<float>(r);
    std::memcpy(&contiguous[r * kStride + kPayload], &scale, 4);
  }
  for (int r = 0; r < 5; ++r) {
    std::memset(&staged[r * kStride], static_cast<int>(row(2, r)), kPayload);
    const float scale = 20.0f + static_cast<float>(r);
    std::memcpy(&staged[r * kStride + kPayload], &scale, 4);
  }
  const std::uint32_t listed[] = {4, 0, 4, 2};  // a token may go to an expert once, but any row order is legal
  const int counts[] = {0, 3, 4};
  const std::byte* blocks[] = {nullptr, contiguous.data(), staged.data()};
  const std::uint32_t* rows[] = {nullptr, nullptr, listed};
  std::vector<std::byte> data(7 * kPayload);
  std::vector<float> scales(7);
  regroup_tokens(counts, blocks, kStride, kPayload, data.data(), scales.data(), rows);
  const std::pair<int, int> expect[] = {{1, 0}, {1, 1}, {1, 2}, {2, 4}, {2, 0}, {2, 4}, {2, 2}};
  for (std::size_t j = 0; j < 7; ++j) {
    const auto [block, r] = expect[j];
    for (std::size_t b = 0; b < kPayload; ++b) EXPECT_EQ(data[j * kPayload + b], row(block, r)) << "row " << j;
    EXPECT_EQ(scales[j], static_cast<float>(10 * block + r)) << "row " << j;
  }
  // Without row lists every block is contiguous: the first 4 rows of the staged block.
  std::vector<std::byte> plain(4 * kPayload);
  const int one[] = {0, 0, 4};
  regroup_tokens(one, blocks, kStride, kPayload, plain.data(), nullptr);
  for (std::size_t j = 0; j < 4; ++j) EXPECT_EQ(plain[j * kPayload], row(2, static_cast<int>(j)));
}

}  // namespace
}  // namespace ubep::moe
