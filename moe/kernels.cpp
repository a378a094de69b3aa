// The CPU loops of dispatch/combine, shared by both layers and timed by bench/micro/ (moe/kernels.hpp).
#include "moe/kernels.hpp"

#include <algorithm>
#include <cstring>

namespace ubep::moe {

void pack_tokens(std::span<const int> toks, std::span<const std::byte> tokens, std::span<const float> scales,
                 std::size_t payload, std::byte* dst, std::size_t stride) {
  for (std::size_t j = 0; j < toks.size(); ++j) {
    std::memcpy(dst + j * stride, tokens.data() + toks[j] * payload, payload);
    if (!scales.empty()) std::memcpy(dst + j * stride + payload, &scales[toks[j]], 4);
  }
}

void regroup_tokens(std::span<const int> counts, std::span<const std::byte* const> blocks, std::size_t stride,
                    std::size_t payload, std::byte* data, float* scales) {
  std::size_t row = 0;
  for (std::size_t s = 0; s < counts.size(); ++s) {
    const int c = counts[s];
    if (c == 0) continue;
    const std::byte* p = blocks[s];
    for (int j = 0; j < c; ++j, ++row) {
      std::memcpy(data + row * payload, p + j * stride, payload);
      if (scales) std::memcpy(&scales[row], p + j * stride + payload, 4);
    }
  }
}

void reduce_outputs(const ExpertMap& map, int topk, std::span<const int> idx, std::span<const float> weights,
                    std::span<const int> pos, std::span<const std::size_t> coffset, const std::byte* combine,
                    std::size_t row_bytes, bool f32, std::size_t hidden, std::span<float> out) {
  const int k = topk, L = map.max_local();
  const int n = static_cast<int>(idx.size() / static_cast<std::size_t>(k));
  std::fill(out.begin(), out.end(), 0.0f);
  for (int t = 0; t < n; ++t) {
    float* o = out.data() + static_cast<std::size_t>(t) * hidden;
    for (int a = 0; a < k; ++a) {
      const int e = idx[static_cast<std::size_t>(t) * k + a], d = map.owner(e), le = e - map.first(d);
      const std::size_t slot = coffset[static_cast<std::size_t>(d) * L + le] + pos[static_cast<std::size_t>(t) * k + a];
      const std::byte* y = combine + slot * row_bytes;
      const float w = weights[static_cast<std::size_t>(t) * k + a];
      if (f32) {
        const float* v = reinterpret_cast<const float*>(y);
        for (std::size_t i = 0; i < hidden; ++i) o[i] += w * v[i];
      } else {
        const std::uint16_t* v = reinterpret_cast<const std::uint16_t*>(y);
        for (std::size_t i = 0; i < hidden; ++i) o[i] += w * bf16_bits_to_float(v[i]);
      }
    }
  }
}

namespace {
constexpr std::size_t kBlock = 256;  // floats of a block: 1 KiB, in L1 with its inputs

/// acc[0..n) (op)= row[off..off+n) as floats, times w; first: acc = 0 + w * row.
inline void madd(float* acc, const std::byte* row, bool f32, std::size_t off, std::size_t n, float w, bool first) {
  if (f32) {
    const float* v = reinterpret_cast<const float*>(row) + off;
    if (first) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + w * v[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] += w * v[i];
    }
  } else {
    const std::uint16_t* v = reinterpret_cast<const std::uint16_t*>(row) + off;
    if (first) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + w * bf16_bits_to_float(v[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] += w * bf16_bits_to_float(v[i]);
    }
  }
}
/// acc = 0 + row (first) or acc += row, for rows of type R (no weight: not even a multiplication by 1).
inline void add(float* acc, const std::byte* row, bool f32, std::size_t off, std::size_t n, bool first) {
  if (f32) {
    const float* v = reinterpret_cast<const float*>(row) + off;
    if (first) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + v[i];
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] += v[i];
    }
  } else {
    const std::uint16_t* v = reinterpret_cast<const std::uint16_t*>(row) + off;
    if (first) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0f + bf16_bits_to_float(v[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] += bf16_bits_to_float(v[i]);
    }
  }
}
/// dst[off..off+n) = round(acc) as type R.
inline void store(const float* acc, std::byte* dst, bool f32, std::size_t off, std::size_t n) {
  if (f32) {
    std::memcpy(reinterpret_cast<float*>(dst) + off, acc, n * sizeof(float));
  } else {
    std::uint16_t* d = reinterpret_cast<std::uint16_t*>(dst) + off;
    for (std::size_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(acc[i]);
  }
}
}  // namespace

void partial_row(std::span<const float> w, std::span<const std::byte* const> y, bool y_f32, std::size_t hidden,
                 bool r_f32, std::byte* dst) {
  float acc[kBlock];
  for (std::size_t off = 0; off < hidden; off += kBlock) {
    const std::size_t n = std::min(kBlock, hidden - off);
    if (w.empty()) std::fill(acc, acc + n, 0.0f);
    for (std::size_t a = 0; a < w.size(); ++a) madd(acc, y[a], y_f32, off, n, w[a], a == 0);
    store(acc, dst, r_f32, off, n);
  }
}

void node_row(std::span<const std::byte* const> rows, bool r_f32, std::size_t hidden, std::byte* dst) {
  float acc[kBlock];
  for (std::size_t off = 0; off < hidden; off += kBlock) {
    const std::size_t n = std::min(kBlock, hidden - off);
    if (rows.empty()) std::fill(acc, acc + n, 0.0f);
    for (std::size_t r = 0; r < rows.size(); ++r) add(acc, rows[r], r_f32, off, n, r == 0);
    store(acc, dst, r_f32, off, n);
  }
}

void reduce_token(std::span<const NodeTerm> terms, bool r_f32, std::size_t hidden, float* out) {
  float ns[kBlock];
  std::uint16_t rounded[kBlock];
  for (std::size_t off = 0; off < hidden; off += kBlock) {
    const std::size_t n = std::min(kBlock, hidden - off);
    float* o = out + off;
    std::fill(o, o + n, 0.0f);
    for (const NodeTerm& t : terms) {
      if (t.node_row) {
        add(o, t.node_row, r_f32, off, n, false);
        continue;
      }
      if (t.rows.empty()) std::fill(ns, ns + n, 0.0f);
      for (std::size_t r = 0; r < t.rows.size(); ++r) add(ns, t.rows[r], r_f32, off, n, r == 0);
      if (t.round && !r_f32) {
        for (std::size_t i = 0; i < n; ++i) rounded[i] = float_to_bf16_bits(ns[i]);
        for (std::size_t i = 0; i < n; ++i) o[i] += bf16_bits_to_float(rounded[i]);
      } else {
        for (std::size_t i = 0; i < n; ++i) o[i] += ns[i];
      }
    }
  }
}

}  // namespace ubep::moe
