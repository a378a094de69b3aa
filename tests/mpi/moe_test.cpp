// MoE dispatch/combine: ubep::moe::Layer and the BSP baseline give bit-identical outputs, equal to a serial
// reference, for many routings and shapes; run-ahead under random delays; bad input; one regression test
// per defect of issue 10 (MoeIssue10.*). CTest runs this file
// at 2, 3 and 4 ranks under the default route, the forced mpi route and UBEP_VIRTUAL_NODES=2.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tests/mpi/moe_reference.hpp"
#include "tests/mpi/test_util.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

using moe::Config;
using moe::DType;

using test::bit_identical;
using test::expert_fn;
using test::Input;
using test::make_input;
using test::reference;
using test::Routing;

// Computes every local expert of one call in completion order and sends each back at once.
void send_outputs(moe::LayerBase& layer, const Config& c, moe::Handle& h) {
  const std::size_t ob = c.hidden * moe::element_size(moe::output_dtype(c.dtype));
  const std::size_t tb = c.hidden * moe::element_size(c.dtype);
  int seen = 0;
  while (auto le = layer.next_expert(h)) {
    const moe::ExpertTokens t = layer.expert_tokens(h, *le);
    std::vector<std::byte> out(static_cast<std::size_t>(t.count) * ob);
    for (int j = 0; j < t.count; ++j) {
      expert_fn(c, t.expert, t.data.data() + j * tb, t.scales.empty() ? 1.0f : t.scales[j], out.data() + j * ob);
    }
    layer.combine_send(h, *le, out);
    ++seen;
  }
  EXPECT_EQ(seen, layer.local_experts());
}

// Runs one call through a layer: experts in completion order, each sent back at once.
std::vector<float> run(moe::LayerBase& layer, const Config& c, const Input& in) {
  moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
  send_outputs(layer, c, h);
  std::vector<float> result(static_cast<std::size_t>(in.n) * c.hidden);
  layer.combine_recv(h, result);
  return result;
}

Options opts() {
  Options o = Options::from_env();
  o.heap_size = 64u << 20;
  return o;
}

struct Case {
  int experts, hidden, topk, max_tokens;
  DType dtype;
  Routing routing;
};

TEST(Moe, UbepEqualsBspEqualsReference) {
  Context ctx(MPI_COMM_WORLD, opts());
  const std::vector<Case> cases = {
      {8, 32, 2, 16, DType::bf16, Routing::uniform},        {8, 32, 2, 16, DType::bf16, Routing::zipf},
      {8, 16, 1, 8, DType::f32, Routing::one_rank},         {7, 16, 2, 12, DType::f32, Routing::uniform},
      {9, 24, 8, 10, DType::bf16, Routing::uniform},        {16, 64, 8, 16, DType::e4m3, Routing::zipf},
      {5, 8, 3, 6, DType::e4m3, Routing::nothing_from_odd}, {8, 16, 2, 8, DType::bf16, Routing::empty_on_some},
      {3, 8, 1, 4, DType::f32, Routing::uniform},
  };
  unsigned seed = 1;
  for (const Case& cs : cases) {
    Config c{cs.experts, cs.hidden, cs.dtype, cs.topk, cs.max_tokens};
    moe::Layer ubep(ctx, c);
    moe::BspLayer bsp(ctx, c);
    for (int rep = 0; rep < 3; ++rep, ++seed) {
      const Input in = make_input(c, ctx.rank(), ctx.size(), cs.routing, seed);
      const auto a = run(ubep, c, in);
      const auto b = run(bsp, c, in);
      const auto ref = reference(ctx, c, in);
      ASSERT_EQ(a.size(), ref.size());
      EXPECT_TRUE(bit_identical(a, b)) << "ubep and bsp differ: experts " << cs.experts << " topk " << cs.topk << " "
                                       << to_string(cs.dtype);
      EXPECT_TRUE(bit_identical(a, ref)) << "ubep differs from the serial reference: experts " << cs.experts << " topk "
                                         << cs.topk << " " << to_string(cs.dtype) << " routing "
                                         << static_cast<int>(cs.routing);
    }
  }
  ctx.finalize();
}

TEST(Moe, SplitPhasesAndPlainCombine) {
  Context ctx(MPI_COMM_WORLD, opts());
  Config c{6, 16, DType::bf16, 2, 8};
  moe::Layer layer(ctx, c);
  const Input in = make_input(c, ctx.rank(), ctx.size(), Routing::uniform, 99);
  moe::Handle h = layer.dispatch(in.tokens, in.idx, in.weights);
  const std::size_t ob = c.hidden * 2, tb = c.hidden * 2;
  std::vector<std::vector<std::byte>> outs(layer.local_experts());
  std::vector<std::span<const std::byte>> views;
  for (int le = 0; le < layer.local_experts(); ++le) {
    const auto t = layer.expert_tokens(h, le);
    outs[le].resize(t.count * ob);
    for (int j = 0; j < t.count; ++j) expert_fn(c, t.expert, t.data.data() + j * tb, 1.0f, outs[le].data() + j * ob);
    views.emplace_back(outs[le]);
  }
  std::vector<float> out(static_cast<std::size_t>(in.n) * c.hidden);
  layer.combine(h, views, out);
  const auto ref = reference(ctx, c, in);
  EXPECT_TRUE(bit_identical(out, ref));
  ctx.finalize();
}

// 1000 calls, two in flight at a time, random ranks sleeping at random points: every token comes back
// exactly once with the right value (nothing lost, duplicated or stale).
TEST(Moe, RunAheadUnderRandomDelays) {
  Options o = opts();
  o.run_ahead = 2;
  Context ctx(MPI_COMM_WORLD, o);
  Config c{8, 8, DType::f32, 2, 6};
  moe::Layer layer(ctx, c);
  std::mt19937 rng(1234u + static_cast<unsigned>(ctx.rank()));
  auto maybe_sleep = [&] {
    if (rng() % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
  };
  constexpr int kCalls = 1000;
  struct InFlight {
    moe::Handle h;
    Input in;
  };
  std::vector<InFlight> q;
  int bad = 0;
  const std::size_t ob = c.hidden * 4;
  auto complete = [&](InFlight& f) {
    while (auto le = layer.next_expert(f.h)) {
      maybe_sleep();
      const auto t = layer.expert_tokens(f.h, *le);
      std::vector<std::byte> out(t.count * ob);
      for (int j = 0; j < t.count; ++j) expert_fn(c, t.expert, t.data.data() + j * ob, 1.0f, out.data() + j * ob);
      layer.combine_send(f.h, *le, out);
    }
    std::vector<float> result(static_cast<std::size_t>(f.in.n) * c.hidden);
    layer.combine_recv(f.h, result);
    bad += !bit_identical(result, reference(ctx, c, f.in));
  };
  for (int call = 0; call < kCalls; ++call) {
    maybe_sleep();
    Input in = make_input(c, ctx.rank(), ctx.size(), Routing::uniform, 5000u + call);
    moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights);
    q.push_back({std::move(h), std::move(in)});
    if (q.size() == 2) {
      complete(q.front());
      q.erase(q.begin());
    }
  }
  for (auto& f : q) complete(f);
  EXPECT_EQ(bad, 0) << bad << " of " << kCalls << " calls returned wrong outputs";
  ctx.finalize();
}

TEST(Moe, BadInputIsReportedAndPeersTimeOut) {
  Options o = opts();
  o.wait_timeout = std::chrono::duration<double>(2.0);
  Context ctx(MPI_COMM_WORLD, o);
  Config c{8, 8, DType::f32, 2, 4};
  const std::string me = "rank " + std::to_string(ctx.rank());
  // Mismatched setup across ranks.
  Config odd = c;
  odd.hidden = 8 + ctx.rank();
  test::expect_error(Errc::collective_mismatch, [&] { moe::Layer l(ctx, odd); }, {"moe::Layer", "hidden"});
  if (ctx.size() > 1) {  // zero_copy on some ranks only: their heaps would differ
    Config half = c;
    half.zero_copy = ctx.rank() % 2 == 0;
    test::expect_error(Errc::collective_mismatch, [&] { moe::Layer l(ctx, half); }, {"moe::Layer", "zero_copy"});
  }
  moe::Layer layer(ctx, c);
  std::vector<std::byte> tok(4 * 8 * 4);
  std::vector<float> w(8, 0.5f);
  std::vector<int> idx = {0, 1, 2, 3, 4, 5, 6, 7};
  test::expect_error(Errc::out_of_range,
                     [&] {
                       (void)layer.dispatch_send(tok, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 8}, w);
                     },
                     {me, "dispatch", "expert id 8", "[0, 8)"});
  test::expect_error(Errc::invalid_argument,
                     [&] {
                       (void)layer.dispatch_send(tok, std::vector<int>{0, 1, 2, 2, 4, 5, 6, 7}, w);
                     },
                     {"expert 2 twice"});
  std::vector<std::byte> big(5 * 8 * 4);
  std::vector<float> w10(10, 0.5f);
  test::expect_error(Errc::out_of_range,
                     [&] {
                       (void)layer.dispatch_send(big, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1}, w10);
                     },
                     {"n=5", "max_tokens_per_rank=4"});
  // Nothing was lost: a good call still works on every rank.
  Input in = make_input(c, ctx.rank(), ctx.size(), Routing::uniform, 77);
  const auto a = run(layer, c, in);
  EXPECT_TRUE(bit_identical(a, reference(ctx, c, in)));
  // Rank 0 gives a bad expert id and never sends; the others time out naming rank 0.
  if (ctx.rank() == 0) {
    test::expect_error(Errc::out_of_range,
                       [&] {
                         (void)layer.dispatch_send(tok, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 99}, w);
                       },
                       {"rank 0", "expert id 99"});
  } else {
    moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights);
    try {
      while (layer.next_expert(h)) {
      }
      ADD_FAILURE() << "the dispatch completed without rank 0";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::timeout) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    }
  }
  // The test's own synchronization (plain MPI, not ubep): rank 0 must not start finalize's 2 s deadline
  // before the peers' waits have expired.
  MPI_Barrier(MPI_COMM_WORLD);
  ctx.finalize();
}

// ---- issue 10: one regression test per defect ----------------------------------------------------

// The size an OutOfHeap message tells the user to set, 0 if it names none.
std::size_t advised_heap_size(const OutOfHeap& e) {
  const std::string msg = e.what(), key = "set UBEP_HEAP_SIZE to at least ";
  const std::size_t at = msg.find(key);
  return at == std::string::npos ? 0 : std::stoull(msg.substr(at + key.size()));
}

// Item 4: with UBEP_HEAP_SIZE not a multiple of 4 KiB the Context rounds the heap up, more is free than
// was asked for, and `need + (heap_size - heap_free())` came out smaller than what is needed. Setting
// exactly the advised size must work, on an empty heap and on one that already holds an object.
TEST(MoeIssue10, OutOfHeapAdviceIsEnough) {
  const Config c{8, 64, DType::bf16, 2, 32};
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::size_t need = moe::Layer::heap_bytes(c, size, 2);  // one node; the node map's below
  for (const std::size_t heap : {std::size_t{12345}, std::size_t{2 * 4096 + 1}}) {
    for (const std::size_t before : {std::size_t{0}, std::size_t{1000}}) {
      Options o = opts();
      o.run_ahead = 2;
      o.heap_size = heap;
      std::size_t advised = 0;
      {
        Context ctx(MPI_COMM_WORLD, o);
        need = moe::Layer::heap_bytes(c, ctx.topology(), 2);
        {
          Symmetric<std::byte> other = ctx.alloc<std::byte>(before);
          try {
            moe::Layer layer(ctx, c);
            ADD_FAILURE() << "a " << need << "-byte layer fit into UBEP_HEAP_SIZE=" << heap;
          } catch (const OutOfHeap& e) {
            advised = advised_heap_size(e);
            EXPECT_GE(advised, need + before) << e.what();
            EXPECT_LE(advised, need + before + 2 * 4096) << "the advice is far above the need: " << e.what();
          }
        }
        ctx.finalize();
      }
      if (advised == 0) continue;
      o.heap_size = advised;
      Context ctx(MPI_COMM_WORLD, o);
      {
        Symmetric<std::byte> other = ctx.alloc<std::byte>(before);
        try {
          moe::Layer layer(ctx, c);
          const Input in = make_input(c, ctx.rank(), ctx.size(), Routing::uniform, 31);
          EXPECT_TRUE(bit_identical(run(layer, c, in), reference(ctx, c, in)));
        } catch (const OutOfHeap& e) {
          ADD_FAILURE() << "UBEP_HEAP_SIZE=" << advised << " as advised (asked " << heap << ", " << before
                        << " bytes in use before) is not enough: " << e.what();
        }
      }
      ctx.finalize();
    }
  }
}

// Item 5: an element type outside moe::DType was accepted by both layers. Every rank passes the same
// config, so every rank throws, before any collective.
TEST(MoeIssue10, UnknownDTypeIsRejected) {
  Context ctx(MPI_COMM_WORLD, opts());
  Config c{8, 8, static_cast<DType>(7), 2, 4};
  const std::string me = "rank " + std::to_string(ctx.rank());
  test::expect_error(Errc::invalid_argument, [&] { moe::Layer l(ctx, c); }, {me, "moe::Layer", "dtype=7"});
  test::expect_error(Errc::invalid_argument, [&] { moe::BspLayer l(ctx, c); }, {me, "moe::BspLayer", "dtype=7"});
  // No rank was left inside a collective: a good layer still builds and works.
  c.dtype = DType::f32;
  moe::Layer layer(ctx, c);
  const Input in = make_input(c, ctx.rank(), ctx.size(), Routing::uniform, 41);
  EXPECT_TRUE(bit_identical(run(layer, c, in), reference(ctx, c, in)));
  ctx.finalize();
}

// Item 12: with run-ahead 2, combine_recv(h1) before h0 let call 2 reuse call 0's buffer set, and
// combine_recv(h0) then reduced call 2's outputs. Calls complete in dispatch order: the later one is
// rejected on every rank, the layer stays usable, and the calls then give the serial reference. Twice
// per layer, so that the second round runs on calls 2 and 3.
TEST(MoeIssue10, OutOfOrderCombineIsRejected) {
  Options o = opts();
  o.run_ahead = 2;
  Context ctx(MPI_COMM_WORLD, o);
  const Config c{8, 8, DType::f32, 2, 6};
  const std::string me = "rank " + std::to_string(ctx.rank());
  moe::Layer ubep_layer(ctx, c);
  moe::BspLayer bsp_layer(ctx, c);
  unsigned seed = 600;
  for (moe::LayerBase* layer : {static_cast<moe::LayerBase*>(&ubep_layer), static_cast<moe::LayerBase*>(&bsp_layer)}) {
    for (int round = 0; round < 2; ++round) {
      const Input in0 = make_input(c, ctx.rank(), ctx.size(), Routing::uniform, seed++);
      const Input in1 = make_input(c, ctx.rank(), ctx.size(), Routing::uniform, seed++);
      moe::Handle h0 = layer->dispatch_send(in0.tokens, in0.idx, in0.weights);
      moe::Handle h1 = layer->dispatch_send(in1.tokens, in1.idx, in1.weights);
      send_outputs(*layer, c, h0);
      send_outputs(*layer, c, h1);
      std::vector<float> out0(static_cast<std::size_t>(in0.n) * c.hidden);
      std::vector<float> out1(static_cast<std::size_t>(in1.n) * c.hidden);
      const std::string given = "call #" + std::to_string(h1.call()), oldest = "call #" + std::to_string(h0.call());
      test::expect_error(Errc::invalid_argument, [&] { layer->combine_recv(h1, out1); },
                         {me, "combine_recv", given, oldest, "dispatch order"});
      const std::vector<std::span<const std::byte>> none(layer->local_experts());
      test::expect_error(Errc::invalid_argument, [&] { layer->combine(h1, none, out1); },
                         {me, "combine", given, oldest});
      layer->combine_recv(h0, out0);
      layer->combine_recv(h1, out1);
      EXPECT_TRUE(bit_identical(out0, reference(ctx, c, in0))) << layer->name() << " round " << round;
      EXPECT_TRUE(bit_identical(out1, reference(ctx, c, in1))) << layer->name() << " round " << round;
    }
  }
  ctx.finalize();
}

// Item 12, found beside it: an owner that received call 1 completely before call 0 released call 1 by
// setting its release word to 2, which also said "call 0 released"; a source that needed nothing back
// from that owner in call 0 then dispatched call 2 into call 0's set before the owner had read call 0.
// Releases now go out in call order. Rank 1 receives call 1 first and gives rank 0 a second to get its
// call 2 through (it must not: rank 0 is held until rank 1 has received call 0); the test's own messages
// are plain MPI. Passing never depends on the timing; only the detection of the defect does.
// Under per_node across nodes rank 0's call 2 goes into the relay's inbox, which the relay frees once it has
// forwarded call 0: there the early dispatch is correct, and the outputs are still checked.
void later_call_received_first(moe::Combine mode) {
  Options o = opts();
  o.run_ahead = 2;
  Context ctx(MPI_COMM_WORLD, o);
  Config c{8, 8, DType::f32, 2, 6};
  c.combine = mode;
  const bool relayed = mode == moe::Combine::per_node && ctx.topology().node_of(0) != ctx.topology().node_of(1);
  moe::Layer layer(ctx, c);
  const int rank = ctx.rank();
  std::vector<Input> in;
  for (int call = 0; call < 3; ++call) in.push_back(make_input(c, rank, ctx.size(), Routing::uniform, 700 + call));
  if (rank == 0) in[0] = Input{};  // rank 0 sends nothing in call 0, so its combine of call 0 waits for no owner
  const auto dispatch = [&](int call) { return layer.dispatch_send(in[call].tokens, in[call].idx, in[call].weights); };
  const auto check = [&](moe::Handle& h, int call) {
    std::vector<float> out(static_cast<std::size_t>(in[call].n) * c.hidden);
    layer.combine_recv(h, out);
    EXPECT_TRUE(bit_identical(out, reference(ctx, c, in[call]))) << "call " << call;
  };
  constexpr int kTag = 4210;  // rank 0 -> rank 1: "my dispatch of call 2 returned"
  int token = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  moe::Handle h0 = dispatch(0), h1 = dispatch(1), h2;
  if (rank == 1) {
    MPI_Irecv(&token, 1, MPI_INT, 0, kTag, MPI_COMM_WORLD, &req);
    send_outputs(layer, c, h1);
    bool early = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!early && std::chrono::steady_clock::now() < until) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      early = done != 0;
      if (!early) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!relayed)
      EXPECT_FALSE(early) << "rank 0 dispatched call 2 into the buffer set of call 0 before rank 1 had received call 0";
    send_outputs(layer, c, h0);
    check(h0, 0);
    check(h1, 1);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else {
    send_outputs(layer, c, h0);
    check(h0, 0);
    if (rank == 0) {
      h2 = dispatch(2);
      MPI_Isend(&token, 1, MPI_INT, 1, kTag, MPI_COMM_WORLD, &req);
    }
    send_outputs(layer, c, h1);
    check(h1, 1);
  }
  if (rank != 0) h2 = dispatch(2);
  send_outputs(layer, c, h2);
  check(h2, 2);
  if (rank == 0) MPI_Wait(&req, MPI_STATUS_IGNORE);
  ctx.finalize();
}

TEST(MoeIssue10, LaterCallReceivedFirstKeepsEarlierSetBusy) { later_call_received_first(moe::Combine::per_expert); }
TEST(MoeIssue10, LaterCallReceivedFirstKeepsEarlierSetBusyPerRank) {
  later_call_received_first(moe::Combine::per_rank);
}
TEST(MoeIssue10, LaterCallReceivedFirstPerNode) { later_call_received_first(moe::Combine::per_node); }

}  // namespace
}  // namespace ubep
