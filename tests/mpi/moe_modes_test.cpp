// The combine modes of moe::Layer (moe.hpp, "Combine modes") from the outside, public headers only:
//   MoeModes.MatchReference*   every mode (per_rank and per_node with and without float_partials) and every
//                              dtype gives the serial reference of the documented order bit for bit, for
//                              experts not divisible by ranks, ranks without experts, ranks without tokens,
//                              all tokens to one expert, top-1 and top-k = all experts, an odd hidden;
//                              per_rank, per_node and BspLayer agree bit for bit;
//   MoeModes.ThousandCalls*    1000 calls with changing routing, run-ahead and split phases;
//                              each also with Config::zero_copy (expert_outputs, mixed with the copying call);
//   MoeModes.ThousandCallsZeroCopy  the zero-copy combine across set reuse at run-ahead 3;
//   MoeModes.ZeroCopyArgumentErrors  expert_outputs and combine_send(h, e) refuse bad arguments, naming them;
//   MoeModes.TwoLayersInterleaved  a per_rank and a per_node layer with calls of both in flight;
//   MoeModes.TrafficMatchesFormula  the bytes each rank sends on and off its node (LayerBase::traffic()) equal
//                              a count made here from the routing, the node map and the documented relay rule;
//   MoeModes.HeapBytes*        Layer::heap_bytes for the node map is enough as UBEP_HEAP_SIZE in every mode.
// CTest runs this file at 2, 3 and 4 ranks (default and mpi routes), under UBEP_VIRTUAL_NODES=2 at 4 ranks,
// UBEP_VIRTUAL_NODES=3 at 6 ranks, an uneven explicit node map, and across emulated nodes (2x2, 3x2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "tests/mpi/moe_reference.hpp"
#include "tests/mpi/test_util.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

using moe::Combine;
using moe::Config;
using moe::DType;
using test::bit_identical;
using test::expert_fn;
using test::Input;
using test::reference;

constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::e4m3};

struct Mode {
  Combine combine;
  bool float_partials;
};
constexpr Mode kModes[] = {{Combine::per_expert, false}, {Combine::per_rank, false}, {Combine::per_rank, true},
                           {Combine::per_node, false},   {Combine::per_node, true},  {Combine::automatic, false}};
constexpr std::size_t kAutomatic = 5;  // kModes[kAutomatic]: the default mode

std::string describe(const Config& c) {
  std::ostringstream s;
  s << "experts " << c.num_experts << " topk " << c.topk << " hidden " << c.hidden << " max_tokens "
    << c.max_tokens_per_rank << " " << moe::to_string(c.dtype) << " " << moe::to_string(c.combine)
    << (c.float_partials ? " float_partials" : "") << (c.zero_copy ? " zero_copy" : "");
  return s.str();
}

Options opts(std::uint32_t run_ahead = 2) {
  Options o = Options::from_env();
  o.heap_size = 64u << 20;
  o.run_ahead = run_ahead;
  return o;
}

// ---- inputs --------------------------------------------------------------------------------------

// How the tokens of one call are routed. Every choice is a function of (source rank, seed) only, so that
// each rank can recompute every source's routing (the traffic test needs them all).
enum class Route {
  random,      // n in [0, max], distinct random experts in random order
  full,        // n = max everywhere, random experts
  zero_first,  // rank 0 sends nothing, the others max
  zero_last,   // the last rank sends nothing, the others random n
  hot,         // every token's first expert is expert E-1 (top-1: all tokens to that one expert)
  nothing,     // no rank sends anything
};
constexpr Route kRoutes[] = {Route::random,    Route::full, Route::zero_first,
                             Route::zero_last, Route::hot,  Route::nothing};

const char* to_string(Route r) {
  switch (r) {
    case Route::random: return "random";
    case Route::full: return "full";
    case Route::zero_first: return "zero_first";
    case Route::zero_last: return "zero_last";
    case Route::hot: return "hot";
    case Route::nothing: return "nothing";
  }
  return "?";
}

// The routing of source `src` (its n, topk_idx and topk_weights); tokens and scales stay empty.
Input routing_of(const Config& c, int src, int size, Route r, unsigned seed) {
  std::mt19937 rng(seed * 104729u + static_cast<unsigned>(src) * 31u + 17u);
  Input in;
  const int max = c.max_tokens_per_rank;
  switch (r) {
    case Route::random: in.n = static_cast<int>(rng() % static_cast<unsigned>(max + 1)); break;
    case Route::full: in.n = max; break;
    case Route::zero_first: in.n = src == 0 ? 0 : max; break;
    case Route::zero_last: in.n = src == size - 1 ? 0 : static_cast<int>(1 + rng() % static_cast<unsigned>(max)); break;
    case Route::hot: in.n = max; break;
    case Route::nothing: in.n = 0; break;
  }
  for (int t = 0; t < in.n; ++t) {
    std::vector<int> chosen;
    if (r == Route::hot) chosen.push_back(c.num_experts - 1);
    while (static_cast<int>(chosen.size()) < c.topk) {
      const int e = static_cast<int>(rng() % static_cast<unsigned>(c.num_experts));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int k = 0; k < c.topk; ++k) {
      in.idx.push_back(chosen[k]);
      in.weights.push_back(0.25f + 0.5f * static_cast<float>(rng() % 1000) / 1000.0f);
    }
  }
  return in;
}

// This rank's input: its routing and token values that change with the seed.
Input input_of(const Config& c, int rank, int size, Route r, unsigned seed) {
  Input in = routing_of(c, rank, size, r, seed);
  const std::size_t es = moe::element_size(c.dtype);
  in.tokens.resize(static_cast<std::size_t>(in.n) * c.hidden * es);
  for (int t = 0; t < in.n; ++t) {
    const float scale = 0.25f + 0.125f * static_cast<float>((t + seed) % 5);
    for (int i = 0; i < c.hidden; ++i) {
      const float v = test::token_value(rank, t + static_cast<int>(seed % 97u) * 7, i);
      moe::store_element(c.dtype, in.tokens.data() + static_cast<std::size_t>(t) * c.hidden * es, i, v, scale);
    }
    if (c.dtype == DType::e4m3) in.scales.push_back(scale);
  }
  return in;
}

// ---- driving one call ----------------------------------------------------------------------------

// How a call's experts are computed and sent back.
enum class Phases {
  completion_order,  // dispatch, then next_expert: each expert as it completes, sent back at once
  split_reversed,    // dispatch_send, dispatch_recv, then the local experts in reverse order
  plain_combine,     // dispatch, then every output at once through combine()
};

std::vector<std::byte> compute(const Config& c, const moe::ExpertTokens& t) {
  const std::size_t ob = c.hidden * moe::element_size(moe::output_dtype(c.dtype));
  const std::size_t tb = c.hidden * moe::element_size(c.dtype);
  std::vector<std::byte> out(static_cast<std::size_t>(t.count) * ob);
  for (int j = 0; j < t.count; ++j)
    expert_fn(c, t.expert, t.data.data() + j * tb, t.scales.empty() ? 1.0f : t.scales[j], out.data() + j * ob);
  return out;
}

// Computes local expert `le` and sends its outputs back. Under Config::zero_copy the experts mix the three ways
// ("Zero-copy combine" in moe.hpp): le % 3 == 0 writes into expert_outputs and calls combine_send(h, le); 1 passes
// its own buffer (the copying call); 2 writes into expert_outputs and passes that span to the copying call.
void give_back(moe::LayerBase& layer, const Config& c, moe::Handle& h, int le) {
  const std::vector<std::byte> y = compute(c, layer.expert_tokens(h, le));
  if (!c.zero_copy || le % 3 == 1) return layer.combine_send(h, le, y);
  const std::span<std::byte> rows = layer.expert_outputs(h, le);
  ASSERT_EQ(rows.size(), y.size()) << "expert_outputs of local expert " << le << ": " << describe(c);
  ASSERT_EQ(layer.expert_outputs(h, le).data(), rows.data()) << "expert_outputs moved between two calls";
  if (!y.empty()) std::memcpy(rows.data(), y.data(), y.size());
  if (le % 3 == 0) return layer.combine_send(h, le);
  layer.combine_send(h, le, rows);
}

// Computes and sends back every local expert of a call that was dispatch_sent (any call in flight).
void send_outputs(moe::LayerBase& layer, const Config& c, moe::Handle& h, Phases p) {
  if (p == Phases::split_reversed) {
    layer.dispatch_recv(h);
    for (int le = layer.local_experts() - 1; le >= 0; --le) give_back(layer, c, h, le);
    return;
  }
  int seen = 0;
  while (auto le = layer.next_expert(h)) {
    give_back(layer, c, h, *le);
    ++seen;
  }
  EXPECT_EQ(seen, layer.local_experts());
}

std::vector<float> run(moe::LayerBase& layer, const Config& c, const Input& in, Phases p) {
  std::vector<float> out(static_cast<std::size_t>(in.n) * c.hidden);
  if (p == Phases::plain_combine) {
    moe::Handle h = layer.dispatch(in.tokens, in.idx, in.weights, in.scales);
    std::vector<std::vector<std::byte>> outs(layer.local_experts());
    std::vector<std::span<const std::byte>> views;
    for (int le = 0; le < layer.local_experts(); ++le) {
      outs[le] = compute(c, layer.expert_tokens(h, le));
      views.emplace_back(outs[le]);
      if (c.zero_copy && le % 2 == 0) {  // combine() with the layer's own rows: sent in place
        const std::span<std::byte> rows = layer.expert_outputs(h, le);
        if (!outs[le].empty()) std::memcpy(rows.data(), outs[le].data(), outs[le].size());
        views.back() = rows;
      }
    }
    layer.combine(h, views, out);
    return out;
  }
  moe::Handle h = p == Phases::split_reversed ? layer.dispatch_send(in.tokens, in.idx, in.weights, in.scales)
                                              : layer.dispatch(in.tokens, in.idx, in.weights, in.scales);
  send_outputs(layer, c, h, p);
  layer.combine_recv(h, out);
  return out;
}

// ---- 1. bit-exactness ------------------------------------------------------------------------------

struct Shape {
  int experts, topk, hidden = 8;
};

// Every mode, dtype and route for the shapes given, against the reference, BspLayer and each other, and
// checks that the references of per_expert and per_rank differ somewhere (that the test can tell them apart).
void match_reference(const std::vector<Shape>& shapes) {
  Context ctx(MPI_COMM_WORLD, opts());
  const int P = ctx.size(), me = ctx.rank();
  int discriminating = 0;  // calls whose per_expert and per_rank references differ on this rank
  unsigned seed = 1;
  for (const Shape& sh : shapes) {
    for (const DType dt : kDTypes) {
      Config base{sh.experts, sh.hidden, dt, sh.topk, 5};
      std::vector<Input> inputs;
      for (const Route r : kRoutes) inputs.push_back(input_of(base, me, P, r, seed++));
      // outs[mode][call]
      std::vector<std::vector<std::vector<float>>> outs(std::size(kModes));
      for (std::size_t m = 0; m < std::size(kModes); ++m) {
        Config c = base;
        c.combine = kModes[m].combine;
        c.float_partials = kModes[m].float_partials;
        Config zc = c;
        zc.zero_copy = true;
        moe::Layer ubep(ctx, c), ubep_zc(ctx, zc);
        moe::BspLayer bsp(ctx, c), bsp_zc(ctx, zc);
        for (std::size_t r = 0; r < inputs.size(); ++r) {
          const Phases ph = static_cast<Phases>((r + m) % 3);
          const Input& in = inputs[r];
          const auto a = run(ubep, c, in, ph);
          const auto b = run(bsp, c, in, ph);
          const auto ref = reference(ctx, c, in);
          // The zero-copy combine (expert_outputs, mixed with the copying combine_send) gives the same bits.
          EXPECT_TRUE(bit_identical(run(ubep_zc, zc, in, ph), ref))
              << "rank " << me << " of " << P
              << ": Layer with expert_outputs differs from the serial reference: " << describe(zc) << " route "
              << to_string(kRoutes[r]);
          EXPECT_TRUE(bit_identical(run(bsp_zc, zc, in, ph), ref))
              << "rank " << me << " of " << P
              << ": BspLayer with expert_outputs differs from the serial reference: " << describe(zc) << " route "
              << to_string(kRoutes[r]);
          EXPECT_TRUE(bit_identical(a, ref)) << "rank " << me << " of " << P << ": Layer differs from the serial "
                                             << "reference: " << describe(c) << " route " << to_string(kRoutes[r]);
          EXPECT_TRUE(bit_identical(b, ref)) << "rank " << me << " of " << P << ": BspLayer differs from the serial "
                                             << "reference: " << describe(c) << " route " << to_string(kRoutes[r]);
          if (c.combine == Combine::per_rank && !c.float_partials) {
            Config pe = c;
            pe.combine = Combine::per_expert;
            discriminating += !bit_identical(ref, reference(ctx, pe, in));
          }
          outs[m].push_back(a);
        }
      }
      // per_rank and per_node (same float_partials) bit-identical to each other; automatic to the mode it
      // resolves to (per_expert on one node, per_node across nodes).
      const std::size_t resolved = ctx.topology().num_nodes() > 1 ? 3 : 0;
      for (std::size_t r = 0; r < inputs.size(); ++r) {
        EXPECT_TRUE(bit_identical(outs[kAutomatic][r], outs[resolved][r]))
            << "rank " << me << ": automatic differs from " << moe::to_string(kModes[resolved].combine) << ": experts "
            << sh.experts << " topk " << sh.topk << " " << moe::to_string(dt);
        EXPECT_TRUE(bit_identical(outs[1][r], outs[3][r]))
            << "rank " << me << ": per_rank and per_node differ: experts " << sh.experts << " topk " << sh.topk << " "
            << moe::to_string(dt) << " route " << to_string(kRoutes[r]);
        EXPECT_TRUE(bit_identical(outs[2][r], outs[4][r]))
            << "rank " << me << ": per_rank and per_node differ with float_partials: experts " << sh.experts << " topk "
            << sh.topk << " " << moe::to_string(dt) << " route " << to_string(kRoutes[r]);
      }
    }
  }
  // With bf16 partials and top-k > 1 the orders round differently somewhere: else the test could not tell a
  // layer that ignores Config::combine from one that follows it.
  int total = 0;
  MPI_Allreduce(&discriminating, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GT(total, 0) << "no call's per_rank reference differs from per_expert's";
  ctx.finalize();
}

// Experts not divisible by the ranks (7 = prime, 3 < ranks at 4 and 6 ranks: ranks without experts, relays
// among them), top-1 (all tokens to one expert under Route::hot) and top-k = all experts.
TEST(MoeModes, MatchReferenceTop1) { match_reference({{7, 1}, {3, 1}}); }
// {5, 2, 1}: one-element tokens (2 bytes of bf16, narrower than the row index a record carries in their place).
TEST(MoeModes, MatchReferenceTopK) { match_reference({{7, 3}, {3, 2}, {5, 2, 3}, {5, 2, 1}}); }
TEST(MoeModes, MatchReferenceTopAll) { match_reference({{7, 7}, {3, 3}}); }

// ---- 1b. 1000 calls, run-ahead, split phases -----------------------------------------------------------

// 1000 calls through one layer with UBEP_RUN_AHEAD = 3 calls in flight, routing and n changing every call,
// experts of a newer call sometimes computed before an older call's, half of them through dispatch_recv
// and reverse expert order. Returns every call's output.
std::vector<std::vector<float>> thousand_calls(Context& ctx, const Config& c) {
  constexpr int kCalls = 1000, kAhead = 3;
  moe::Layer layer(ctx, c);
  struct InFlight {
    moe::Handle h;
    Input in;
    int call;
    bool computed = false;
  };
  std::vector<InFlight> q;
  std::vector<std::vector<float>> outs(kCalls);
  int bad = 0, first_bad = -1;
  const auto compute_call = [&](InFlight& f) {
    if (f.computed) return;
    send_outputs(layer, c, f.h, f.call % 2 == 0 ? Phases::completion_order : Phases::split_reversed);
    f.computed = true;
  };
  const auto finish_oldest = [&] {
    InFlight& f = q.front();
    compute_call(f);
    std::vector<float> out(static_cast<std::size_t>(f.in.n) * c.hidden);
    layer.combine_recv(f.h, out);
    if (!bit_identical(out, reference(ctx, c, f.in))) {
      if (first_bad < 0) first_bad = f.call;
      ++bad;
    }
    outs[f.call] = std::move(out);
    q.erase(q.begin());
  };
  for (int call = 0; call < kCalls; ++call) {
    const Route r = kRoutes[static_cast<std::size_t>(call * 7 + call / 6) % std::size(kRoutes)];
    Input in = input_of(c, ctx.rank(), ctx.size(), r, 9000u + static_cast<unsigned>(call));
    moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
    q.push_back({std::move(h), std::move(in), call});
    if (call % 5 == 1) compute_call(q.back());  // the newest first, then the older ones
    if (static_cast<int>(q.size()) == kAhead) finish_oldest();
  }
  while (!q.empty()) finish_oldest();
  EXPECT_EQ(bad, 0) << "rank " << ctx.rank() << " of " << ctx.size() << ": " << bad << " of " << kCalls
                    << " calls differ from the serial reference, first call " << first_bad << ": " << describe(c);
  const moe::Traffic& t = layer.traffic();
  EXPECT_EQ(t.calls, static_cast<std::uint64_t>(kCalls));
  return outs;
}

TEST(MoeModes, ThousandCallsPerRankEqualsPerNode) {
  Context ctx(MPI_COMM_WORLD, opts(3));
  Config c{7, 8, DType::bf16, 3, 6};
  c.combine = Combine::per_node;
  const auto node = thousand_calls(ctx, c);
  c.combine = Combine::per_rank;
  const auto rank = thousand_calls(ctx, c);
  int differ = 0;
  for (std::size_t i = 0; i < node.size(); ++i) differ += !bit_identical(node[i], rank[i]);
  EXPECT_EQ(differ, 0) << "rank " << ctx.rank() << ": per_rank and per_node differ in " << differ << " of 1000 calls";
  ctx.finalize();
}

// The zero-copy combine over 1000 calls at run-ahead 3: an owner's heap rows of a set are rewritten only after
// every source has read the call that used them before.
TEST(MoeModes, ThousandCallsZeroCopy) {
  Context ctx(MPI_COMM_WORLD, opts(3));
  Config c{7, 8, DType::bf16, 3, 6};
  c.combine = Combine::per_expert;
  c.zero_copy = true;
  (void)thousand_calls(ctx, c);
  ctx.finalize();
}

TEST(MoeModes, ThousandCallsFloatPartialsE4m3) {
  Context ctx(MPI_COMM_WORLD, opts(3));
  Config c{5, 8, DType::e4m3, 2, 4};
  c.combine = Combine::per_node;
  c.float_partials = true;
  (void)thousand_calls(ctx, c);
  ctx.finalize();
}

// Two layers of different modes driven by one thread with calls of both in flight (two MoE layers of one
// model): each call of each layer gives its reference, and the per_rank and per_node calls agree.
TEST(MoeModes, TwoLayersInterleaved) {
  constexpr int kCalls = 200;
  Context ctx(MPI_COMM_WORLD, opts(2));
  Config a{7, 8, DType::bf16, 3, 5}, b = a;
  a.combine = Combine::per_rank;
  b.combine = Combine::per_node;
  moe::Layer la(ctx, a), lb(ctx, b);
  struct InFlight {
    moe::Handle ha, hb;
    Input in;
  };
  std::vector<InFlight> q;
  int bad = 0;
  const auto finish_oldest = [&] {
    InFlight& f = q.front();
    send_outputs(lb, b, f.hb, Phases::split_reversed);  // the later layer's experts first
    send_outputs(la, a, f.ha, Phases::completion_order);
    std::vector<float> oa(static_cast<std::size_t>(f.in.n) * a.hidden), ob(oa.size());
    lb.combine_recv(f.hb, ob);
    la.combine_recv(f.ha, oa);
    bad += !bit_identical(oa, reference(ctx, a, f.in)) || !bit_identical(oa, ob);
    q.erase(q.begin());
  };
  for (int call = 0; call < kCalls; ++call) {
    Input in = input_of(a, ctx.rank(), ctx.size(), kRoutes[static_cast<std::size_t>(call) % std::size(kRoutes)],
                        300u + static_cast<unsigned>(call));
    moe::Handle ha = la.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
    moe::Handle hb = lb.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
    q.push_back({std::move(ha), std::move(hb), std::move(in)});
    if (q.size() == 2) finish_oldest();
  }
  while (!q.empty()) finish_oldest();
  EXPECT_EQ(bad, 0) << "rank " << ctx.rank() << ": " << bad << " of " << kCalls << " calls wrong";
  ctx.finalize();
}

// ---- 2. bytes on and off the node --------------------------------------------------------------------

struct Bytes {
  std::uint64_t dispatch_on = 0, dispatch_off = 0, combine_on = 0, combine_off = 0, calls = 0;
  bool operator==(const Bytes&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Bytes& b) {
  return os << "{calls " << b.calls << ", dispatch on-node " << b.dispatch_on << " off-node " << b.dispatch_off
            << ", combine on-node " << b.combine_on << " off-node " << b.combine_off << "}";
}

Bytes delta(const moe::Traffic& after, const moe::Traffic& before) {
  return {after.dispatch_on_node - before.dispatch_on_node, after.dispatch_off_node - before.dispatch_off_node,
          after.combine_on_node - before.combine_on_node, after.combine_off_node - before.combine_off_node,
          after.calls - before.calls};
}

// What rank `me` sends in one call, counted from every source's routing. Written from moe.hpp (Combine modes,
// Traffic, ExpertMap), not from the layer: experts in contiguous blocks, the first E mod P ranks one more;
// relay of source s on node B = the rank of B (ascending) at (index of s on its node) mod (ranks on B).
Bytes expected_bytes(const Config& c, const std::vector<int>& node_of, int me, bool bsp,
                     const std::vector<Input>& routing) {
  const int P = static_cast<int>(node_of.size());
  const int nodes = *std::max_element(node_of.begin(), node_of.end()) + 1;
  std::vector<std::vector<int>> on_node(nodes);
  for (int r = 0; r < P; ++r) on_node[node_of[r]].push_back(r);
  const auto index_on_node = [&](int r) {
    const auto& v = on_node[node_of[r]];
    return static_cast<int>(std::find(v.begin(), v.end(), r) - v.begin());
  };
  const auto relay = [&](int s, int b) { return on_node[b][index_on_node(s) % static_cast<int>(on_node[b].size())]; };
  const int base = c.num_experts / P, extra = c.num_experts % P;
  const auto owner = [&](int e) {
    const int big = extra * (base + 1);
    return e < big ? e / (base + 1) : extra + (e - big) / base;
  };
  const std::uint64_t token =
      static_cast<std::uint64_t>(c.hidden) * moe::element_size(c.dtype) + (c.dtype == DType::e4m3 ? 4 : 0);
  const std::uint64_t out_row = static_cast<std::uint64_t>(c.hidden) * moe::element_size(moe::output_dtype(c.dtype));
  const bool f32_rows = c.float_partials || c.dtype == DType::f32;
  const std::uint64_t part_row = static_cast<std::uint64_t>(c.hidden) * (f32_rows ? 4 : 2);
  Bytes b;
  b.calls = 1;
  const auto send = [&](bool dispatch, int from, int to, std::uint64_t n) {
    if (from != me || to == me) return;
    const bool on = node_of[from] == node_of[to];
    (dispatch ? (on ? b.dispatch_on : b.dispatch_off) : (on ? b.combine_on : b.combine_off)) += n;
  };
  // automatic, as the header defines it: per_expert on one node, per_node across nodes.
  const Combine automatic = nodes > 1 ? Combine::per_node : Combine::per_expert;
  const Combine mode = bsp ? Combine::per_expert : c.combine == Combine::automatic ? automatic : c.combine;
  for (int s = 0; s < P; ++s) {
    const Input& in = routing[s];
    for (int t = 0; t < in.n; ++t) {
      std::vector<int> owners;
      for (int k = 0; k < c.topk; ++k) {
        const int o = owner(in.idx[t * c.topk + k]);
        if (mode == Combine::per_expert) {
          send(true, s, o, token);
          send(false, o, s, out_row);
        }
        if (std::find(owners.begin(), owners.end(), o) == owners.end()) owners.push_back(o);
      }
      if (mode == Combine::per_rank) {
        for (const int o : owners) {
          send(true, s, o, token);
          send(false, o, s, part_row);
        }
      }
      if (mode != Combine::per_node) continue;
      for (int n = 0; n < nodes; ++n) {
        std::vector<int> here;
        for (const int o : owners)
          if (node_of[o] == n) here.push_back(o);
        if (here.empty()) continue;
        if (n == node_of[s]) {
          for (const int o : here) {
            send(true, s, o, token);
            send(false, o, s, part_row);
          }
          continue;
        }
        const int r = relay(s, n);
        send(true, s, r, token);
        for (const int o : here) {
          send(true, r, o, token);
          send(false, o, r, part_row);
        }
        send(false, r, s, part_row);
      }
    }
  }
  return b;
}

TEST(MoeModes, TrafficMatchesFormula) {
  Context ctx(MPI_COMM_WORLD, opts());
  const int P = ctx.size(), me = ctx.rank();
  std::vector<int> node_of(P);
  for (int r = 0; r < P; ++r) node_of[r] = ctx.topology().node_of(r);
  if (me == 0) {
    std::string map;
    for (int r = 0; r < P; ++r) map += (r ? " " : "") + std::to_string(node_of[r]);
    std::printf("# %d ranks on %d nodes, node of each rank: %s\n", P, ctx.topology().num_nodes(), map.c_str());
  }
  // 2P+1 experts: two or three per rank; 3 experts: ranks (and relays) without experts from 4 ranks on; an
  // odd hidden (token copies of 3 + 4 bytes under e4m3).
  for (const Shape sh : {Shape{2 * P + 1, 3}, Shape{3, 2}, Shape{5, 2, 3}}) {
    for (const DType dt : kDTypes) {
      for (const Mode& m : kModes) {
        Config c{sh.experts, sh.hidden, dt, sh.topk, 6};
        c.combine = m.combine;
        c.float_partials = m.float_partials;
        moe::Layer ubep(ctx, c);
        moe::BspLayer bsp(ctx, c);
        for (const auto [route, seed] :
             {std::pair{Route::random, 41u}, std::pair{Route::zero_last, 42u}, std::pair{Route::hot, 43u}}) {
          std::vector<Input> routing;
          for (int s = 0; s < P; ++s) routing.push_back(routing_of(c, s, P, route, seed));
          const Input in = input_of(c, me, P, route, seed);
          for (moe::LayerBase* layer : {static_cast<moe::LayerBase*>(&ubep), static_cast<moe::LayerBase*>(&bsp)}) {
            const moe::Traffic before = layer->traffic();
            const auto out = run(*layer, c, in, Phases::completion_order);
            // The test's own synchronization (plain MPI): every rank's sends of this call are issued and
            // counted before anyone reads its counters.
            MPI_Barrier(MPI_COMM_WORLD);
            const Bytes got = delta(layer->traffic(), before);
            const Bytes want = expected_bytes(c, node_of, me, layer == &bsp, routing);
            EXPECT_EQ(got, want) << "rank " << me << " of " << P << " (node " << node_of[me] << " of "
                                 << ctx.topology().num_nodes() << "): " << layer->name() << " " << describe(c)
                                 << " route " << to_string(route);
            EXPECT_TRUE(bit_identical(out, reference(ctx, c, in))) << layer->name() << " " << describe(c);
          }
        }
      }
    }
  }
  ctx.finalize();
}

// Per_node on one node moves what per_rank moves; across nodes it sends fewer token copies off the node
// than per_rank when a token has two owners on one remote node (a plain check of the relay's purpose).
TEST(MoeModes, PerNodeSavesOffNodeCopies) {
  Context ctx(MPI_COMM_WORLD, opts());
  const int P = ctx.size(), me = ctx.rank();
  // Every token goes to one expert on each rank: per_rank sends P-1 copies, per_node one per node.
  Config c{P, 8, DType::bf16, P, 4};
  Input in = input_of(c, me, P, Route::full, 77);
  Bytes got[2];
  int i = 0;
  for (const Combine mode : {Combine::per_rank, Combine::per_node}) {
    c.combine = mode;
    moe::Layer layer(ctx, c);
    const auto out = run(layer, c, in, Phases::split_reversed);
    EXPECT_TRUE(bit_identical(out, reference(ctx, c, in))) << describe(c);
    MPI_Barrier(MPI_COMM_WORLD);
    got[i++] = delta(layer.traffic(), moe::Traffic{});
  }
  const Topology& topo = ctx.topology();
  const std::uint64_t token = 8 * 2;
  const auto mine = topo.ranks_on_node(topo.node_of(me));
  const std::uint64_t n = static_cast<std::uint64_t>(in.n), here = mine.size();
  const std::uint64_t on_copies = n * (here - 1), off_copies = n * (static_cast<std::uint64_t>(P) - here);
  EXPECT_EQ(got[0].dispatch_on, on_copies * token) << "rank " << me << " per_rank";
  EXPECT_EQ(got[0].dispatch_off, off_copies * token) << "rank " << me << " per_rank";
  if (topo.num_nodes() == 1) EXPECT_EQ(got[0], got[1]) << "rank " << me << ": per_node on one node";
  // Own tokens: one copy per remote node, not one per remote rank (relay forwards come on top on-node).
  const std::uint64_t own_off = n * static_cast<std::uint64_t>(topo.num_nodes() - 1) * token;
  EXPECT_EQ(got[1].dispatch_off, own_off) << "rank " << me << " per_node";
  ctx.finalize();
}

// ---- heap ------------------------------------------------------------------------------------------

// Layer::heap_bytes for the node map is enough when set exactly as UBEP_HEAP_SIZE (per_node across nodes adds
// the relays' buffers, which the one-node count leaves out).
TEST(MoeModes, HeapBytesForTheNodeMapIsEnough) {
  constexpr unsigned kAhead = 2;
  Topology topo;
  {
    Context probe(MPI_COMM_WORLD, opts(kAhead));
    topo = probe.topology();
    probe.finalize();
  }
  for (const Mode& m : kModes) {
    Config c{7, 8, DType::bf16, 3, 6};
    c.combine = m.combine;
    c.float_partials = m.float_partials;
    Options o = opts(kAhead);
    o.heap_size = moe::Layer::heap_bytes(c, topo, kAhead);
    Context ctx(MPI_COMM_WORLD, o);
    try {
      moe::Layer layer(ctx, c);
      const Input in = input_of(c, ctx.rank(), ctx.size(), Route::full, 5);
      EXPECT_TRUE(bit_identical(run(layer, c, in, Phases::completion_order), reference(ctx, c, in))) << describe(c);
    } catch (const OutOfHeap& e) {
      ADD_FAILURE() << "rank " << ctx.rank() << ": UBEP_HEAP_SIZE=" << o.heap_size
                    << " = Layer::heap_bytes(config, topology, " << kAhead << ") is not enough for " << describe(c)
                    << " on " << topo.num_nodes() << " nodes: " << e.what();
    }
    ctx.finalize();
  }
}

// ---- a relay outside the layer -----------------------------------------------------------------------

// Three calls (buffer sets reused) in which the last rank stays outside the layer after its dispatch_send,
// in `outside_wait` (given the requests of one message from every other rank), until every other rank has
// finished dispatch_recv; then every rank completes the call and the outputs match the reference. Across
// nodes under per_node the others' tokens pass through that rank as a relay.
template <class Wait>
void with_last_rank_outside(Context& ctx, moe::Layer& layer, const Config& c, int seed, Wait&& outside_wait) {
  const int rank = ctx.rank(), size = ctx.size(), outside = size - 1;
  constexpr int kTag = 4242;
  for (int call = 0; call < 3; ++call) {
    const Input in = input_of(c, rank, size, Route::full, seed + call);
    moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
    int token = call;
    if (rank == outside) {
      std::vector<MPI_Request> reqs(size - 1);
      std::vector<int> got(size - 1, -1);
      for (int p = 0; p < size - 1; ++p) MPI_Irecv(&got[p], 1, MPI_INT, p, kTag, MPI_COMM_WORLD, &reqs[p]);
      outside_wait(reqs);
      for (int p = 0; p < size - 1; ++p) {
        ASSERT_EQ(got[p], call) << "rank " << p << " did not finish dispatch_recv of call " << call;
      }
    } else {
      layer.dispatch_recv(h);
      MPI_Send(&token, 1, MPI_INT, outside, kTag, MPI_COMM_WORLD);
    }
    send_outputs(layer, c, h, Phases::completion_order);
    std::vector<float> out(static_cast<std::size_t>(in.n) * c.hidden);
    layer.combine_recv(h, out);
    EXPECT_TRUE(bit_identical(out, reference(ctx, c, in))) << "call " << call;
  }
}

// The last rank calls only Layer::progress() and polls plain MPI while outside: without progress() the
// others' dispatch_recv would time out. On one node there is no relay and the test checks the outputs only.
TEST(MoeModes, ProgressServesRelaysOutsideTheLayer) {
  Options o = opts();
  o.wait_timeout = std::chrono::duration<double>(20.0);
  Context ctx(MPI_COMM_WORLD, o);
  Config c{7, 8, DType::bf16, 3, 6};
  c.combine = Combine::per_node;
  moe::Layer layer(ctx, c);
  with_last_rank_outside(ctx, layer, c, 60, [&](std::vector<MPI_Request>& reqs) {  // 60 s at most
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until) {
      layer.progress();
      MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    }
  });
  ctx.finalize();
}

// With UBEP_MOE_RELAY_THREAD=1 the last rank blocks in plain MPI while outside (MPI_Waitall, no layer call, no
// Layer::progress()): the layer's relay thread forwards the tokens it relays meanwhile. Without the thread
// the others' dispatch_recv would time out (UBEP_WAIT_TIMEOUT) naming that rank. On one node there is no
// relay and no thread; the outputs are checked.
TEST(MoeModes, RelayThreadServesWhileTheRankBlocksInMpi) {
  Options o = opts();
  o.wait_timeout = std::chrono::duration<double>(20.0);
  o.moe_relay_thread = true;
  Context ctx(MPI_COMM_WORLD, o);
  Config c{7, 8, DType::bf16, 3, 6};
  c.combine = Combine::per_node;
  std::unique_ptr<moe::Layer> made;
  try {
    made = std::make_unique<moe::Layer>(ctx, c);
  } catch (const Error& e) {  // the configurations the thread refuses (every rank alike)
    ASSERT_EQ(e.code(), Errc::unsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("UBEP_MOE_RELAY_THREAD=1"), std::string::npos) << e.what();
    ctx.finalize();
    GTEST_SKIP() << e.what();
  }
  with_last_rank_outside(ctx, *made, c, 70, [](std::vector<MPI_Request>& reqs) {
    MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  });
  made.reset();
  ctx.finalize();
}

// The relay thread is refused, before any collective call of the layer and on every rank alike, where its
// sends could not run beside the application: UCX's worker without its threaded mode (UBEP_PROGRESS_THREAD=0
// with ucx-route peers). The error names the rank, the setting and the reason.
TEST(MoeModes, RelayThreadRefusesWhatItCannotServe) {
  Options o = opts();
  o.moe_relay_thread = true;
  o.progress_thread = ProgressThread::off;
  Context ctx(MPI_COMM_WORLD, o);
  bool ucx = false;
  for (int p = 0; p < ctx.size(); ++p) ucx = ucx || ctx.route(p) == ubep::Route::ucx;
  Config c{7, 8, DType::bf16, 3, 6};
  c.combine = Combine::per_node;
  const bool relays = ctx.topology().num_nodes() > 1;
  try {
    moe::Layer layer(ctx, c);
    EXPECT_FALSE(relays && ucx) << "rank " << ctx.rank() << ": a relay thread over UCX without its threaded mode";
  } catch (const Error& e) {
    EXPECT_TRUE(relays && ucx) << e.what();
    EXPECT_EQ(e.code(), Errc::unsupported) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("UBEP_MOE_RELAY_THREAD=1"), std::string::npos) << what;
    EXPECT_NE(what.find("UBEP_PROGRESS_THREAD"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(ctx.rank())), std::string::npos) << what;
  }
  ctx.finalize();
}

// ---- zero-copy combine: argument errors ---------------------------------------------------------------

// expert_outputs and combine_send(h, e) refuse an expert that is not this rank's, one not complete, a send
// without outputs, a wrong-sized span of the layer's rows and a second write after combine_send, each naming
// the rank, the call and the value, and change nothing: the call then completes with the right sums.
TEST(MoeModes, ZeroCopyArgumentErrors) {
  Context ctx(MPI_COMM_WORLD, opts());
  for (const Combine mode : {Combine::automatic, Combine::per_rank}) {
    Config c{7, 8, DType::bf16, 3, 6};
    c.combine = mode;
    c.zero_copy = true;
    moe::Layer layer(ctx, c);
    const std::string me = "rank " + std::to_string(ctx.rank());
    const int local = layer.local_experts();
    const Input in = input_of(c, ctx.rank(), ctx.size(), Route::full, 21);
    moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
    const std::string call = "call " + std::to_string(h.call());
    test::expect_error(Errc::out_of_range, [&] { (void)layer.expert_outputs(h, local); },
                       {me, "expert_outputs", call, "local expert " + std::to_string(local), "not an expert of"});
    test::expect_error(Errc::out_of_range, [&] { (void)layer.expert_outputs(h, -1); },
                       {me, "expert_outputs", "local expert -1"});
    test::expect_error(Errc::out_of_range, [&] { layer.combine_send(h, local); },
                       {me, "combine_send", std::to_string(local)});
    if (local > 0) {  // nothing is regrouped before next_expert or dispatch_recv
      test::expect_error(Errc::invalid_argument, [&] { (void)layer.expert_outputs(h, 0); },
                         {me, "expert_outputs", call, "local expert 0", "not complete"});
    }
    layer.dispatch_recv(h);
    for (int le = 0; le < local; ++le) {
      const std::vector<std::byte> y = compute(c, layer.expert_tokens(h, le));
      test::expect_error(Errc::invalid_argument, [&] { layer.combine_send(h, le); },
                         {me, "combine_send", call, "local expert " + std::to_string(le), "expert_outputs"});
      const std::span<std::byte> rows = layer.expert_outputs(h, le);
      ASSERT_EQ(rows.size(), y.size());
      if (!y.empty()) {
        std::memcpy(rows.data(), y.data(), y.size());
        test::expect_error(Errc::invalid_argument, [&] { layer.combine_send(h, le, rows.first(rows.size() - 2)); },
                           {me, "combine_send", std::to_string(rows.size() - 2), std::to_string(rows.size())});
      }
      layer.combine_send(h, le);
      test::expect_error(Errc::invalid_argument, [&] { (void)layer.expert_outputs(h, le); },
                         {me, "expert_outputs", call, "local expert " + std::to_string(le), "already combine_sent"});
      test::expect_error(Errc::invalid_argument, [&] { layer.combine_send(h, le); },
                         {me, "combine_send", std::to_string(le), "already sent"});
    }
    std::vector<float> out(static_cast<std::size_t>(in.n) * c.hidden);
    layer.combine_recv(h, out);
    EXPECT_TRUE(bit_identical(out, reference(ctx, c, in))) << describe(c);
  }
  ctx.finalize();
}

// ---- bad config ------------------------------------------------------------------------------------

// A combine value outside moe::Combine fails on every rank before any collective, naming the rank, the
// layer and the value; the names parse and print both ways, and an unknown name is refused.
TEST(MoeModes, UnknownCombineIsRejected) {
  Context ctx(MPI_COMM_WORLD, opts());
  Config c{7, 8, DType::bf16, 2, 4};
  c.combine = static_cast<Combine>(9);
  const std::string me = "rank " + std::to_string(ctx.rank());
  test::expect_error(Errc::invalid_argument, [&] { moe::Layer l(ctx, c); }, {me, "moe::Layer", "combine=9"});
  test::expect_error(Errc::invalid_argument, [&] { moe::BspLayer l(ctx, c); }, {me, "moe::BspLayer", "combine=9"});
  for (Combine m : {Combine::per_expert, Combine::per_rank, Combine::per_node, Combine::automatic}) {
    EXPECT_EQ(moe::parse_combine(moe::to_string(m)), m);
  }
  EXPECT_EQ(moe::parse_combine("auto"), Combine::automatic);
  test::expect_error(Errc::invalid_argument, [&] { (void)moe::parse_combine("per_token"); }, {"per_token"});
  // No rank was left inside a collective: a good layer still builds and works.
  c.combine = Combine::per_node;
  moe::Layer layer(ctx, c);
  const Input in = input_of(c, ctx.rank(), ctx.size(), Route::full, 9);
  EXPECT_TRUE(bit_identical(run(layer, c, in, Phases::completion_order), reference(ctx, c, in)));
  ctx.finalize();
}

// The default mode is automatic; a layer resolves it from the node map (per_expert on one node, per_node
// across nodes), Layer and BspLayer alike, and reports the resolved mode in config().
TEST(MoeModes, AutomaticResolvesFromTheNodeMap) {
  Context ctx(MPI_COMM_WORLD, opts());
  const Config c{7, 8, DType::bf16, 2, 4};
  EXPECT_EQ(c.combine, Combine::automatic);
  const Combine want = ctx.topology().num_nodes() > 1 ? Combine::per_node : Combine::per_expert;
  EXPECT_EQ(moe::resolve_combine(Combine::automatic, ctx.topology()), want);
  for (Combine m : {Combine::per_expert, Combine::per_rank, Combine::per_node}) {
    EXPECT_EQ(moe::resolve_combine(m, ctx.topology()), m);
  }
  moe::Layer layer(ctx, c);
  moe::BspLayer bsp(ctx, c);
  EXPECT_EQ(layer.config().combine, want);
  EXPECT_EQ(bsp.config().combine, want);
  const Input in = input_of(c, ctx.rank(), ctx.size(), Route::full, 11);
  EXPECT_TRUE(bit_identical(run(layer, c, in, Phases::completion_order), run(bsp, c, in, Phases::completion_order)));
  ctx.finalize();
}

}  // namespace
}  // namespace ubep
