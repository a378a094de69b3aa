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

void partial_sum(std::span<const float> w, std::span<const std::byte* const> y, bool y_f32, std::size_t hidden,
                 float* acc) {
  std::fill(acc, acc + hidden, 0.0f);
  for (std::size_t a = 0; a < w.size(); ++a) {
    const float wa = w[a];
    if (y_f32) {
      const float* v = reinterpret_cast<const float*>(y[a]);
      for (std::size_t i = 0; i < hidden; ++i) acc[i] += wa * v[i];
    } else {
      const std::uint16_t* v = reinterpret_cast<const std::uint16_t*>(y[a]);
      for (std::size_t i = 0; i < hidden; ++i) acc[i] += wa * bf16_bits_to_float(v[i]);
    }
  }
}

void store_row(const float* acc, std::size_t hidden, bool r_f32, std::byte* dst) {
  if (r_f32) {
    std::memcpy(dst, acc, hidden * sizeof(float));
    return;
  }
  auto* d = reinterpret_cast<std::uint16_t*>(dst);
  for (std::size_t i = 0; i < hidden; ++i) d[i] = float_to_bf16_bits(acc[i]);
}

void add_row(const std::byte* row, bool r_f32, std::size_t hidden, float* acc) {
  if (r_f32) {
    const float* v = reinterpret_cast<const float*>(row);
    for (std::size_t i = 0; i < hidden; ++i) acc[i] += v[i];
  } else {
    const std::uint16_t* v = reinterpret_cast<const std::uint16_t*>(row);
    for (std::size_t i = 0; i < hidden; ++i) acc[i] += bf16_bits_to_float(v[i]);
  }
}

void sum_rows(std::span<const std::byte* const> rows, bool r_f32, std::size_t hidden, float* acc) {
  std::fill(acc, acc + hidden, 0.0f);
  for (const std::byte* r : rows) add_row(r, r_f32, hidden, acc);
}

void reduce_token(std::span<const NodeTerm> terms, bool r_f32, std::size_t hidden, float* ns, std::byte* row,
                  float* out) {
  std::fill(out, out + hidden, 0.0f);
  for (const NodeTerm& n : terms) {
    if (n.node_row) {
      add_row(n.node_row, r_f32, hidden, out);
      continue;
    }
    sum_rows(n.rows, r_f32, hidden, ns);
    if (n.round) {
      store_row(ns, hidden, r_f32, row);
      add_row(row, r_f32, hidden, out);
    } else {
      for (std::size_t i = 0; i < hidden; ++i) out[i] += ns[i];
    }
  }
}

}  // namespace ubep::moe
