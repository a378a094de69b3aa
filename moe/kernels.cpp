// The CPU loops of dispatch/combine, shared by both layers and timed by bench/micro/ (moe/kernels.hpp).
#include "moe/kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ubep/error.hpp"
#include "ubep/options.hpp"

namespace ubep::moe {

void pack_tokens(std::span<const int> toks, std::span<const std::byte> tokens, std::span<const float> scales,
                 std::size_t payload, std::byte* dst, std::size_t stride) {
  for (std::size_t j = 0; j < toks.size(); ++j) {
    std::memcpy(dst + j * stride, tokens.data() + toks[j] * payload, payload);
    if (!scales.empty()) std::memcpy(dst + j * stride + payload, &scales[toks[j]], 4);
  }
}

void regroup_tokens(std::span<const int> counts, std::span<const std::byte* const> blocks, std::size_t stride,
                    std::size_t payload, std::byte* data, float* scales, std::span<const std::uint32_t* const> rows) {
  std::size_t row = 0;
  for (std::size_t s = 0; s < counts.size(); ++s) {
    const int c = counts[s];
    if (c == 0) continue;
    const std::byte* p = blocks[s];
    const std::uint32_t* at = rows.empty() ? nullptr : rows[s];
    for (int j = 0; j < c; ++j, ++row) {
      const std::byte* r = p + (at ? at[j] : static_cast<std::size_t>(j)) * stride;
      std::memcpy(data + row * payload, r, payload);
      if (scales) std::memcpy(&scales[row], r + payload, 4);
    }
  }
}

namespace {

// ---- the portable set: plain loops (GCC vectorizes them for the build's baseline, SSE2) ----------------

void p_madd_bf16(float* acc, const std::uint16_t* v, std::size_t n, float w, bool first) {
  if (first) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + w * bf16_bits_to_float(v[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] += w * bf16_bits_to_float(v[i]);
  }
}
void p_madd_f32(float* acc, const float* v, std::size_t n, float w, bool first) {
  if (first) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + w * v[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] += w * v[i];
  }
}
void p_add_bf16(float* acc, const std::uint16_t* v, std::size_t n, bool first) {
  if (first) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + bf16_bits_to_float(v[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] += bf16_bits_to_float(v[i]);
  }
}
void p_add_f32(float* acc, const float* v, std::size_t n, bool first) {
  if (first) {
    for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + v[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) acc[i] += v[i];
  }
}
void p_store_bf16(const float* acc, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(acc[i]);
}
void p_add_rounded(float* o, const float* ns, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) o[i] += bf16_bits_to_float(float_to_bf16_bits(ns[i]));
}

constexpr RowKernels kPortable{"portable", p_madd_bf16, p_madd_f32, p_add_bf16, p_add_f32, p_store_bf16, p_add_rounded};

constexpr KernelPath kPaths[] = {KernelPath::portable, KernelPath::avx2, KernelPath::avx512};

std::atomic<const RowKernels*> g_active{nullptr};

/// A setting of UBEP_MOE_KERNELS as a path; throws Errc::unsupported for a path this CPU does not run.
KernelPath path_of(MoeKernels k) {
  if (k == MoeKernels::automatic) {
    for (const KernelPath p : {KernelPath::avx512, KernelPath::avx2})
      if (supported(p)) return p;
    return KernelPath::portable;
  }
  const KernelPath p = k == MoeKernels::avx512 ? KernelPath::avx512
                       : k == MoeKernels::avx2 ? KernelPath::avx2
                                               : KernelPath::portable;
  if (!supported(p)) {
    throw Error(Errc::unsupported, std::string("ubep: moe: UBEP_MOE_KERNELS=") + to_string(p) +
                                       ": this CPU (or this build) does not run it; auto picks the fastest it runs");
  }
  return p;
}

/// UBEP_MOE_KERNELS from the environment, read through the settings table (a bad name: Errc::invalid_argument).
KernelPath path_from_env() {
  Options o;
  setting("UBEP_MOE_KERNELS").read_env(o);
  return path_of(o.moe_kernels);
}

/// The active set (resolved from the environment at the first call).
const RowKernels& K() {
  const RowKernels* k = g_active.load(std::memory_order_acquire);
  return k ? *k : row_kernels(active_path());
}

}  // namespace

const char* to_string(KernelPath p) noexcept {
  switch (p) {
    case KernelPath::portable: return "portable";
    case KernelPath::avx2: return "avx2";
    case KernelPath::avx512: return "avx512";
  }
  return "?";
}

#if UBEP_MOE_X86_KERNELS
bool supported(KernelPath p) noexcept {
  __builtin_cpu_init();
  switch (p) {
    case KernelPath::portable: return true;
    case KernelPath::avx2: return __builtin_cpu_supports("avx2");
    case KernelPath::avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}
const RowKernels& row_kernels(KernelPath p) noexcept {
  switch (p) {
    case KernelPath::avx2: return avx2_kernels();
    case KernelPath::avx512: return avx512_kernels();
    case KernelPath::portable: break;
  }
  return kPortable;
}
#else
bool supported(KernelPath p) noexcept { return p == KernelPath::portable; }
const RowKernels& row_kernels(KernelPath) noexcept { return kPortable; }
#endif

void choose_kernels(MoeKernels k) {
  if (g_active.load(std::memory_order_acquire)) return;
  const RowKernels* expected = nullptr;
  g_active.compare_exchange_strong(expected, &row_kernels(path_of(k)), std::memory_order_acq_rel);
}

KernelPath active_path() {
  const RowKernels* k = g_active.load(std::memory_order_acquire);
  if (!k) {
    const RowKernels* expected = nullptr;
    g_active.compare_exchange_strong(expected, &row_kernels(path_from_env()), std::memory_order_acq_rel);
    k = g_active.load(std::memory_order_acquire);
  }
  for (const KernelPath p : kPaths)
    if (supported(p) && &row_kernels(p) == k) return p;
  return KernelPath::portable;
}

void set_active_path(KernelPath p) {
  if (!supported(p)) {
    throw Error(Errc::unsupported, std::string("ubep: moe: kernel path ") + to_string(p) + " does not run on this CPU");
  }
  g_active.store(&row_kernels(p), std::memory_order_release);
}

const char* kernels() { return to_string(active_path()); }

namespace {
constexpr std::size_t kBlock = 256;  // floats of a block: 1 KiB, in L1 with its inputs

/// acc[0..n) (op)= row[off..off+n) as floats, times w; first: acc = 0 + w * row.
inline void madd(const RowKernels& k, float* acc, const std::byte* row, bool f32, std::size_t off, std::size_t n,
                 float w, bool first) {
  if (f32) {
    k.madd_f32(acc, reinterpret_cast<const float*>(row) + off, n, w, first);
  } else {
    k.madd_bf16(acc, reinterpret_cast<const std::uint16_t*>(row) + off, n, w, first);
  }
}
/// acc = 0 + row (first) or acc += row, for rows of type R (no weight: not even a multiplication by 1).
inline void add(const RowKernels& k, float* acc, const std::byte* row, bool f32, std::size_t off, std::size_t n,
                bool first) {
  if (f32) {
    k.add_f32(acc, reinterpret_cast<const float*>(row) + off, n, first);
  } else {
    k.add_bf16(acc, reinterpret_cast<const std::uint16_t*>(row) + off, n, first);
  }
}
/// dst[off..off+n) = round(acc) as type R.
inline void store(const RowKernels& k, const float* acc, std::byte* dst, bool f32, std::size_t off, std::size_t n) {
  if (f32) {
    std::memcpy(reinterpret_cast<float*>(dst) + off, acc, n * sizeof(float));
  } else {
    k.store_bf16(acc, reinterpret_cast<std::uint16_t*>(dst) + off, n);
  }
}
}  // namespace

void reduce_outputs(const ExpertMap& map, int topk, std::span<const int> idx, std::span<const float> weights,
                    std::span<const int> pos, std::span<const std::byte* const> batch, std::size_t row_bytes, bool f32,
                    std::size_t hidden, std::span<float> out) {
  const RowKernels& k = K();
  const int L = map.max_local();
  const std::size_t kk = static_cast<std::size_t>(topk);
  const std::size_t n = idx.size() / kk;
  constexpr std::size_t kMaxK = 64;  // rows of a token at hand at once; a larger topk goes in chunks of rows
  const std::byte* rows[kMaxK];
  for (std::size_t t = 0; t < n; ++t) {
    float* o = out.data() + t * hidden;
    for (std::size_t a0 = 0; a0 < kk; a0 += kMaxK) {
      const std::size_t m = std::min(kMaxK, kk - a0);
      for (std::size_t a = 0; a < m; ++a) {
        const int e = idx[t * kk + a0 + a], d = map.owner(e), le = e - map.first(d);
        rows[a] =
            batch[static_cast<std::size_t>(d) * L + le] + static_cast<std::size_t>(pos[t * kk + a0 + a]) * row_bytes;
      }
      // Block by block, so that out[t] is written once per chunk of rows; per element the order stays
      // 0 + w[0] * y[0] + w[1] * y[1] + ..., as documented.
      for (std::size_t off = 0; off < hidden; off += kBlock) {
        const std::size_t b = std::min(kBlock, hidden - off);
        for (std::size_t a = 0; a < m; ++a) {
          madd(k, o + off, rows[a], f32, off, b, weights[t * kk + a0 + a], a0 + a == 0);
        }
      }
    }
  }
}

std::vector<const std::byte*> batches_at(std::span<const std::size_t> coffset, const std::byte* combine,
                                         std::size_t row_bytes) {
  std::vector<const std::byte*> b(coffset.size());
  for (std::size_t i = 0; i < coffset.size(); ++i) b[i] = combine + coffset[i] * row_bytes;
  return b;
}

void partial_row(std::span<const float> w, std::span<const std::byte* const> y, bool y_f32, std::size_t hidden,
                 bool r_f32, std::byte* dst) {
  const RowKernels& k = K();
  float acc[kBlock];
  for (std::size_t off = 0; off < hidden; off += kBlock) {
    const std::size_t n = std::min(kBlock, hidden - off);
    if (w.empty()) std::fill(acc, acc + n, 0.0f);
    for (std::size_t a = 0; a < w.size(); ++a) madd(k, acc, y[a], y_f32, off, n, w[a], a == 0);
    store(k, acc, dst, r_f32, off, n);
  }
}

void node_row(std::span<const std::byte* const> rows, bool r_f32, std::size_t hidden, std::byte* dst) {
  const RowKernels& k = K();
  float acc[kBlock];
  for (std::size_t off = 0; off < hidden; off += kBlock) {
    const std::size_t n = std::min(kBlock, hidden - off);
    if (rows.empty()) std::fill(acc, acc + n, 0.0f);
    for (std::size_t r = 0; r < rows.size(); ++r) add(k, acc, rows[r], r_f32, off, n, r == 0);
    store(k, acc, dst, r_f32, off, n);
  }
}

void reduce_token(std::span<const NodeTerm> terms, bool r_f32, std::size_t hidden, float* out) {
  const RowKernels& k = K();
  float ns[kBlock];
  for (std::size_t off = 0; off < hidden; off += kBlock) {
    const std::size_t n = std::min(kBlock, hidden - off);
    float* o = out + off;
    std::fill(o, o + n, 0.0f);
    for (const NodeTerm& t : terms) {
      if (t.node_row) {
        add(k, o, t.node_row, r_f32, off, n, false);
        continue;
      }
      if (t.rows.empty()) std::fill(ns, ns + n, 0.0f);
      for (std::size_t r = 0; r < t.rows.size(); ++r) add(k, ns, t.rows[r], r_f32, off, n, r == 0);
      if (t.round && !r_f32) {
        k.add_rounded(o, ns, n);
      } else {
        k.add_f32(o, ns, n, false);
      }
    }
  }
}

}  // namespace ubep::moe
