// The inputs, the expert and the serial reference of the MoE tests (tests/mpi/moe_test.cpp,
// tests/mpi/moe_modes_test.cpp). The reference is written from the documented reduction order (moe.hpp,
// "Combine modes") and the public headers only, never from the layer's code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ubep/ubep.hpp"

namespace ubep::test {

using moe::Config;
using moe::DType;

enum class Routing { uniform, zipf, one_rank, nothing_from_odd, empty_on_some };

struct Input {
  int n = 0;
  std::vector<std::byte> tokens;
  std::vector<int> idx;
  std::vector<float> weights, scales;
};

inline float token_value(int rank, int t, int i) { return std::sin(0.1f * (rank * 1000 + t * 17 + i)) * 4.0f; }

inline Input make_input(const Config& c, int rank, int size, Routing r, unsigned seed) {
  std::mt19937 rng(seed * 7919u + static_cast<unsigned>(rank));
  Input in;
  in.n = c.max_tokens_per_rank;
  if (r == Routing::empty_on_some && rank % 2 == 1) in.n = 0;
  if (r == Routing::uniform || r == Routing::zipf) in.n = static_cast<int>(rng() % (c.max_tokens_per_rank + 1));
  const std::size_t es = moe::element_size(c.dtype);
  in.tokens.resize(static_cast<std::size_t>(in.n) * c.hidden * es);
  for (int t = 0; t < in.n; ++t) {
    for (int i = 0; i < c.hidden; ++i) {
      const float v = token_value(rank, t, i);
      std::byte* p = in.tokens.data() + (static_cast<std::size_t>(t) * c.hidden + i) * es;
      if (c.dtype == DType::f32) std::memcpy(p, &v, 4);
      if (c.dtype == DType::bf16) {
        const std::uint16_t b = moe::float_to_bf16(v);
        std::memcpy(p, &b, 2);
      }
      if (c.dtype == DType::e4m3) {
        const std::uint8_t q = moe::float_to_e4m3(v / 0.5f);
        std::memcpy(p, &q, 1);
      }
    }
    if (c.dtype == DType::e4m3) in.scales.push_back(0.5f);
    // top-k distinct experts
    std::vector<int> chosen;
    while (static_cast<int>(chosen.size()) < c.topk) {
      int e = 0;
      switch (r) {
        case Routing::zipf: {
          // one hot expert (0) gets about half the picks
          e = (rng() % 2 == 0) ? 0 : static_cast<int>(rng() % c.num_experts);
          break;
        }
        case Routing::one_rank:
          e = static_cast<int>(rng() % c.num_experts) % std::max(1, moe::ExpertMap{c.num_experts, size}.count(0));
          break;
        default: e = static_cast<int>(rng() % c.num_experts);
      }
      if (r == Routing::one_rank && moe::ExpertMap{c.num_experts, size}.count(0) < c.topk)
        e = static_cast<int>(rng() % c.num_experts);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int k = 0; k < c.topk; ++k) {
      in.idx.push_back(chosen[k]);
      in.weights.push_back(0.25f + 0.5f * static_cast<float>(rng() % 1000) / 1000.0f);
    }
  }
  if (r == Routing::nothing_from_odd && rank % 2 == 1) {
    in = Input{};
    if (c.dtype == DType::e4m3) in.scales.clear();
  }
  return in;
}

inline float decode(const Config& c, const std::byte* tok, float scale, int i) {
  return moe::load_element(c.dtype, tok, i, scale);
}

// The expert: y = x * (1 + 0.01 (e + 1)), rounded to the output type.
inline void expert_fn(const Config& c, int e, const std::byte* tok, float scale, std::byte* out) {
  for (int i = 0; i < c.hidden; ++i) {
    const float y = decode(c, tok, scale, i) * (1.0f + 0.01f * static_cast<float>(e + 1));
    if (moe::output_dtype(c.dtype) == DType::f32) {
      std::memcpy(out + 4 * i, &y, 4);
    } else {
      const std::uint16_t b = moe::float_to_bf16(y);
      std::memcpy(out + 2 * i, &b, 2);
    }
  }
}

// The serial reference of the documented reduction order (moe.hpp, "Combine modes"), written from the
// header's formulas, not from the layer's code: per_expert sums over k; per_rank/per_node sum each owner's
// experts in k order (rounded to the row type), the owners of a node in rank order (rounded for a node other
// than this rank's), then the nodes in order. Combine::automatic is the mode resolve_combine names.
inline std::vector<float> reference(const Context& ctx, const Config& c, const Input& in) {
  const std::size_t ob = c.hidden * moe::element_size(moe::output_dtype(c.dtype));
  const std::size_t tb = c.hidden * moe::element_size(c.dtype);
  const bool out_f32 = moe::output_dtype(c.dtype) == DType::f32;
  const bool row_f32 = out_f32 || c.float_partials;
  const auto round_row = [&](float v) { return row_f32 ? v : moe::bf16_to_float(moe::float_to_bf16(v)); };
  const moe::ExpertMap map{c.num_experts, ctx.size()};
  const Topology& topo = ctx.topology();
  std::vector<float> out(static_cast<std::size_t>(in.n) * c.hidden, 0.0f);
  std::vector<std::byte> y(ob);
  // y(t, a) as floats
  std::vector<std::vector<float>> ys(c.topk, std::vector<float>(c.hidden));
  for (int t = 0; t < in.n; ++t) {
    for (int k = 0; k < c.topk; ++k) {
      const int e = in.idx[t * c.topk + k];
      expert_fn(c, e, in.tokens.data() + t * tb, in.scales.empty() ? 1.0f : in.scales[t], y.data());
      for (int i = 0; i < c.hidden; ++i) {
        ys[k][i] = out_f32 ? reinterpret_cast<const float*>(y.data())[i]
                           : moe::bf16_to_float(reinterpret_cast<const std::uint16_t*>(y.data())[i]);
      }
    }
    float* o = out.data() + static_cast<std::size_t>(t) * c.hidden;
    if (moe::resolve_combine(c.combine, topo) == moe::Combine::per_expert) {
      for (int k = 0; k < c.topk; ++k) {
        for (int i = 0; i < c.hidden; ++i) o[i] += in.weights[t * c.topk + k] * ys[k][i];
      }
      continue;
    }
    for (int i = 0; i < c.hidden; ++i) {
      float total = 0.0f;
      for (int n = 0; n < topo.num_nodes(); ++n) {
        bool touched = false;
        float node_sum = 0.0f;
        for (int owner : topo.ranks_on_node(n)) {
          bool mine = false;
          float partial = 0.0f;
          for (int k = 0; k < c.topk; ++k) {
            if (map.owner(in.idx[t * c.topk + k]) != owner) continue;
            mine = true;
            partial += in.weights[t * c.topk + k] * ys[k][i];
          }
          if (!mine) continue;
          touched = true;
          node_sum += round_row(partial);
        }
        if (!touched) continue;
        total += n == topo.node_of(ctx.rank()) ? node_sum : round_row(node_sum);
      }
      o[i] = total;
    }
  }
  return out;
}

// Bit for bit (memcmp, not float ==), and never memcmp on the null data() of an empty vector.
inline bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace ubep::test
