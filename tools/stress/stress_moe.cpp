// ubep-stress, MoE part: every MoE round draws a config (dtype, combine mode, float partials, experts, top-k,
// hidden, tokens) from the seed and the round, and for each rank a routing (random distinct experts, random
// weights, a random token count that is 0 on some ranks and calls), runs 1 to 3 calls through moe::Layer
// (overlapped up to UBEP_RUN_AHEAD, experts in completion or reverse order, or combine()), then the same
// inputs through moe::BspLayer, and compares the outputs bit for bit (docs/MOE.md: every mode of Layer equals
// BspLayer of the same mode).
#include "stress_moe.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

namespace ubep::stress {
namespace {

using moe::Combine;
using moe::Config;
using moe::DType;

struct Input {
  int n = 0;
  std::vector<std::byte> tokens;
  std::vector<int> idx;
  std::vector<float> weights, scales;
};

std::string describe(const Config& c) {
  std::ostringstream s;
  s << moe::to_string(c.combine) << (c.float_partials ? "+float_partials" : "") << " " << moe::to_string(c.dtype)
    << " experts " << c.num_experts << " topk " << c.topk << " hidden " << c.hidden << " max_tokens "
    << c.max_tokens_per_rank << (c.zero_copy ? " zero_copy" : "");
  return s.str();
}

Config draw_config(const MoeSettings& s, std::uint64_t round, int ranks) {
  Rng rng(key({s.seed, 101, round}));
  Config c;
  c.dtype = static_cast<DType>(rng.below(3));
  c.combine = static_cast<Combine>(rng.below(4));  // per_expert, per_rank, per_node, automatic
  c.float_partials = c.combine != Combine::per_expert && rng.chance(0.3);
  // Fewer experts than ranks now and then: ranks without experts.
  c.num_experts = static_cast<int>(
      rng.chance(0.15) ? rng.range(1, static_cast<std::uint64_t>(std::max(1, ranks - 1)))
                       : rng.range(static_cast<std::uint64_t>(ranks), static_cast<std::uint64_t>(4 * ranks + 3)));
  c.topk = static_cast<int>(rng.range(1, static_cast<std::uint64_t>(std::min(c.num_experts, 6))));
  c.hidden = static_cast<int>(rng.range(1, static_cast<std::uint64_t>(s.max_hidden)));
  c.max_tokens_per_rank = static_cast<int>(rng.range(1, static_cast<std::uint64_t>(s.max_tokens)));
  c.zero_copy = rng.chance(0.5);  // even local experts then write into expert_outputs
  return c;
}

Input draw_input(const MoeSettings& s, const Config& c, std::uint64_t round, int call, int rank, bool all_zero) {
  Rng rng(key({s.seed, 102, round, static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(rank)}));
  Input in;
  in.n = all_zero || rng.chance(0.2)
             ? 0
             : static_cast<int>(rng.range(1, static_cast<std::uint64_t>(c.max_tokens_per_rank)));
  const std::size_t es = moe::element_size(c.dtype);
  in.tokens.resize(static_cast<std::size_t>(in.n) * c.hidden * es);
  for (int t = 0; t < in.n; ++t) {
    const float scale = c.dtype == DType::e4m3 ? 0.25f + 0.75f * static_cast<float>(rng.uniform()) : 1.0f;
    for (int i = 0; i < c.hidden; ++i) {
      const float v = static_cast<float>(rng.uniform() * 8.0 - 4.0);
      moe::store_element(c.dtype, in.tokens.data() + static_cast<std::size_t>(t) * c.hidden * es, i, v, scale);
    }
    if (c.dtype == DType::e4m3) in.scales.push_back(scale);
    std::vector<int> chosen;
    while (static_cast<int>(chosen.size()) < c.topk) {
      const int e = static_cast<int>(rng.below(static_cast<std::uint64_t>(c.num_experts)));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int k = 0; k < c.topk; ++k) {
      in.idx.push_back(chosen[k]);
      in.weights.push_back(static_cast<float>(0.05 + rng.uniform()));
    }
  }
  return in;
}

float decode(const Config& c, const std::byte* tok, float scale, int i) {
  return moe::load_element(c.dtype, tok, i, scale);
}

// The expert: y = x * (1 + 0.01 (e + 1)) + 0.001 i, rounded to the output type.
std::vector<std::byte> compute(const Config& c, const moe::ExpertTokens& t) {
  const bool f32 = moe::output_dtype(c.dtype) == DType::f32;
  const std::size_t ob = static_cast<std::size_t>(c.hidden) * (f32 ? 4 : 2);
  const std::size_t tb = static_cast<std::size_t>(c.hidden) * moe::element_size(c.dtype);
  std::vector<std::byte> out(static_cast<std::size_t>(t.count) * ob);
  for (int j = 0; j < t.count; ++j) {
    const std::byte* tok = t.data.data() + j * tb;
    for (int i = 0; i < c.hidden; ++i) {
      const float y =
          decode(c, tok, t.scales.empty() ? 1.0f : t.scales[j], i) * (1.0f + 0.01f * static_cast<float>(t.expert + 1)) +
          0.001f * static_cast<float>(i);
      std::byte* o = out.data() + j * ob;
      if (f32) {
        std::memcpy(o + 4 * i, &y, 4);
      } else {
        const std::uint16_t b = moe::float_to_bf16(y);
        std::memcpy(o + 2 * i, &b, 2);
      }
    }
  }
  return out;
}

// A compute phase outside the layer: sleeps in short steps and calls Layer::progress() between them.
void compute_delay(moe::Layer& layer, std::chrono::microseconds d, std::vector<Hist>& hist) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
    {
      Timer t(hist, Op::moe_progress);
      layer.progress();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

void moe_round(Context& ctx, const MoeSettings& s, std::uint64_t round, std::uint32_t stall_ms, std::vector<Hist>& hist,
               Counters& counters, Mismatches& mismatches) {
  const int P = ctx.size(), me = ctx.rank();
  const Config c = draw_config(s, round, P);
  Rng shape(key({s.seed, 103, round}));
  const int calls = static_cast<int>(shape.range(1, 3));
  const bool overlap = calls >= 2 && ctx.options().run_ahead >= 2 && shape.chance(0.5);
  std::vector<Input> in;
  for (int k = 0; k < calls; ++k) in.push_back(draw_input(s, c, round, k, me, shape.chance(0.05)));
  Rng local(key({s.seed, 104, round, static_cast<std::uint64_t>(me)}));  // this rank's delays and phases

  std::vector<std::vector<float>> got(calls), want(calls);
  {
    moe::Layer layer(ctx, c);
    auto delay = [&](bool stall) {
      if (stall && stall_ms > 0) {
        ++counters.stalls;
        counters.stall_ms += stall_ms;
        compute_delay(layer, std::chrono::milliseconds(stall_ms), hist);
      } else if (s.delay_prob > 0 && local.chance(s.delay_prob)) {
        ++counters.delays;
        compute_delay(layer, std::chrono::microseconds(local.range(1, s.delay_max_us)), hist);
      }
    };
    const int stall_call = static_cast<int>(local.below(static_cast<std::uint64_t>(calls)));
    // Serves the experts of a call that was dispatch_sent: completion order, or all received then reversed.
    auto compute_layer = [&](const moe::ExpertTokens& t) {
      auto out = compute(c, t);
      if (s.inject && !out.empty()) out[0] ^= std::byte{0x40};  // a different first element
      return out;
    };
    // Under Config::zero_copy the even local experts go back through expert_outputs and combine_send(h, le).
    auto give = [&](moe::Handle& h, int le, const std::vector<std::byte>& out) {
      if (c.zero_copy && le % 2 == 0) {
        const std::span<std::byte> rows = layer.expert_outputs(h, le);
        if (!out.empty()) std::memcpy(rows.data(), out.data(), out.size());
        Timer t(hist, Op::moe_combine_send);
        layer.combine_send(h, le);
        return;
      }
      Timer t(hist, Op::moe_combine_send);
      layer.combine_send(h, le, out);
    };
    auto serve = [&](moe::Handle& h, bool reversed) {
      if (reversed) {
        {
          Timer t(hist, Op::moe_dispatch_recv);
          layer.dispatch_recv(h);
        }
        for (int le = layer.local_experts() - 1; le >= 0; --le) {
          auto out = compute_layer(layer.expert_tokens(h, le));
          delay(false);
          give(h, le, out);
        }
        return;
      }
      int seen = 0;
      for (;;) {
        std::optional<int> le;
        {
          Timer t(hist, Op::moe_next_expert);
          le = layer.next_expert(h);
        }
        if (!le) break;
        ++seen;
        auto out = compute_layer(layer.expert_tokens(h, *le));
        delay(false);
        give(h, *le, out);
      }
      if (seen != layer.local_experts()) {
        mismatches.report(round, "moe: next_expert returned " + std::to_string(seen) + " experts, the rank owns " +
                                     std::to_string(layer.local_experts()) + " (" + describe(c) + ")");
      }
    };
    auto send = [&](int k) {
      Timer t(hist, Op::moe_dispatch_send);
      return layer.dispatch_send(in[k].tokens, in[k].idx, in[k].weights, in[k].scales);
    };
    auto recv = [&](moe::Handle& h, int k) {
      got[k].assign(static_cast<std::size_t>(in[k].n) * c.hidden, 0.0f);
      Timer t(hist, Op::moe_combine_recv);
      layer.combine_recv(h, got[k]);
    };
    int k = 0;
    if (overlap) {  // two calls in flight, the younger served first
      moe::Handle h0 = send(0), h1 = send(1);
      delay(stall_call <= 1);
      serve(h1, local.chance(0.5));
      serve(h0, local.chance(0.5));
      recv(h0, 0);
      recv(h1, 1);
      k = 2;
    }
    for (; k < calls; ++k) {
      const auto phases = local.below(3);
      if (phases == 2) {  // dispatch + combine()
        moe::Handle h = layer.dispatch(in[k].tokens, in[k].idx, in[k].weights, in[k].scales);
        delay(k == stall_call);
        std::vector<std::vector<std::byte>> outs(layer.local_experts());
        std::vector<std::span<const std::byte>> views;
        for (int le = 0; le < layer.local_experts(); ++le) {
          outs[le] = compute_layer(layer.expert_tokens(h, le));
          views.emplace_back(outs[le]);
        }
        got[k].assign(static_cast<std::size_t>(in[k].n) * c.hidden, 0.0f);
        Timer t(hist, Op::moe_combine);
        layer.combine(h, views, got[k]);
        continue;
      }
      moe::Handle h = send(k);
      delay(k == stall_call);
      serve(h, phases == 1);
      recv(h, k);
    }
    for (const auto& x : in) {
      ++counters.moe_calls;
      counters.moe_tokens += static_cast<std::uint64_t>(x.n);
      counters.zero_token_calls += x.n == 0;
    }
  }

  // The baseline: plain MPI collectives, entered only once no rank needs another's progress (barrier).
  {
    Timer t(hist, Op::barrier);
    ctx.barrier();
  }
  {
    moe::BspLayer bsp(ctx, c);
    for (int k = 0; k < calls; ++k) {
      Timer t(hist, Op::bsp_layer_call);
      moe::Handle h = bsp.dispatch(in[k].tokens, in[k].idx, in[k].weights, in[k].scales);
      std::vector<std::vector<std::byte>> outs(bsp.local_experts());
      std::vector<std::span<const std::byte>> views;
      for (int le = 0; le < bsp.local_experts(); ++le) {
        outs[le] = compute(c, bsp.expert_tokens(h, le));
        views.emplace_back(outs[le]);
      }
      want[k].assign(static_cast<std::size_t>(in[k].n) * c.hidden, 0.0f);
      bsp.combine(h, views, want[k]);
    }
  }
  for (int k = 0; k < calls; ++k) {
    counters.bytes_checked += got[k].size() * sizeof(float);
    if (got[k].size() == want[k].size() &&
        (got[k].empty() || std::memcmp(got[k].data(), want[k].data(), got[k].size() * sizeof(float)) == 0))
      continue;
    std::size_t i = 0;
    while (i < got[k].size() && i < want[k].size() && std::memcmp(&got[k][i], &want[k][i], sizeof(float)) == 0) ++i;
    std::ostringstream m;
    m << "moe: Layer differs from BspLayer, call " << k << " of " << calls << (overlap ? " (overlapped)" : "") << ", "
      << describe(c) << ", " << in[k].n << " tokens: first difference at token "
      << (c.hidden > 0 ? i / static_cast<std::size_t>(c.hidden) : 0) << " element "
      << (c.hidden > 0 ? i % static_cast<std::size_t>(c.hidden) : 0);
    if (i < got[k].size() && i < want[k].size())
      m << ": expected " << want[k][i] << " got " << got[k][i];
    else
      m << ": sizes " << want[k].size() << " vs " << got[k].size();
    mismatches.report(round, m.str());
  }
}

}  // namespace ubep::stress
