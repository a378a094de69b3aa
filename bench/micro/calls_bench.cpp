// ubep_micro_calls: what one ubep call costs on the load/store route, in one process (Google Benchmark).
// A singleton MPI job (run it without mpirun) holds one Context; every call targets this rank (route
// self: the same code as a node peer on the shm route, whose heap is mapped alike), so what is timed is
// the call's own work -- argument checks, route dispatch, the copy and the signal store -- without a
// peer, a ping-pong or a second core:
//   calls/raw/...           the floor: memcpy into the heap and a release store (what a put_signal must do);
//   calls/put/..., get/...  ctx.put / ctx.get of `bytes` into a symmetric object;
//   calls/put_signal/...    ctx.put_signal of `bytes` and a set of a signal word;
//   calls/wait_until/ready  ctx.wait_until on a signal that already holds (a wait's first check);
//   calls/signal_op, atomic_fetch_add;
//   dispatch_copy/...       moe::Layer's copy of a peer's tokens into its region on the load/store route:
//                           one checked ctx.put per token (before issue 17) against one ctx.ptr for the
//                           region and a plain pack (moe/kernels.hpp, the layer's own loop).
// `objects` live symmetric objects besides the ones timed (a solver holds hundreds): the object-bounds
// check must not grow with them. docs/BENCHMARKS.md ("Per-call cost") says how to read it.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "moe/kernels.hpp"
#include "ubep/context.hpp"

namespace {

ubep::Context* g_ctx = nullptr;

/// The objects of one benchmark: a payload, a signal word, and `extra` other live objects allocated
/// in between (so the timed ones are neither the first nor the last of the heap).
struct Objects {
  std::vector<ubep::Symmetric<std::byte>> extra;
  ubep::Symmetric<std::byte> payload;
  std::vector<ubep::Symmetric<std::byte>> extra2;
  ubep::Symmetric<std::uint64_t> sig;
  std::vector<std::byte> src;
  Objects(std::size_t bytes, int extra_objects) : src(bytes, std::byte{1}) {
    ubep::Context& ctx = *g_ctx;
    for (int i = 0; i < extra_objects / 2; ++i) extra.push_back(ctx.alloc<std::byte>(64));
    payload = ctx.alloc<std::byte>(bytes);
    for (int i = 0; i < extra_objects - extra_objects / 2; ++i) extra2.push_back(ctx.alloc<std::byte>(64));
    sig = ctx.alloc_signals(1);
  }
};

void call_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "objects"});
  for (int objects : {0, 1000}) {
    for (int bytes : {8, 64}) b->Args({bytes, objects});
  }
}

void BM_raw(benchmark::State& state) {
  Objects o(static_cast<std::size_t>(state.range(0)), static_cast<int>(state.range(1)));
  std::uint64_t epoch = 0;
  for (auto _ : state) {
    std::memcpy(o.payload.data(), o.src.data(), o.src.size());
    std::atomic_ref<std::uint64_t>(o.sig[0]).store(++epoch, std::memory_order_release);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_raw)->Name("calls/raw")->Apply(call_args);

void BM_put(benchmark::State& state) {
  Objects o(static_cast<std::size_t>(state.range(0)), static_cast<int>(state.range(1)));
  for (auto _ : state) {
    g_ctx->put(o.payload.data(), o.src.data(), o.src.size(), 0);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_put)->Name("calls/put")->Apply(call_args);

void BM_get(benchmark::State& state) {
  Objects o(static_cast<std::size_t>(state.range(0)), static_cast<int>(state.range(1)));
  for (auto _ : state) {
    g_ctx->get(o.src.data(), o.payload.data(), o.src.size(), 0);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_get)->Name("calls/get")->Apply(call_args);

void BM_put_signal(benchmark::State& state) {
  Objects o(static_cast<std::size_t>(state.range(0)), static_cast<int>(state.range(1)));
  std::uint64_t epoch = 0;
  for (auto _ : state) {
    g_ctx->put_signal(o.payload.data(), o.src.data(), o.src.size(), o.sig.data(), ++epoch, ubep::SignalOp::set, 0);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_put_signal)->Name("calls/put_signal")->Apply(call_args);

void BM_wait_ready(benchmark::State& state) {
  Objects o(8, static_cast<int>(state.range(1)));
  g_ctx->put_signal(o.payload.data(), o.src.data(), 8, o.sig.data(), 1, ubep::SignalOp::set, 0);
  for (auto _ : state) benchmark::DoNotOptimize(g_ctx->wait_until(o.sig.data(), ubep::Cmp::ge, 1));
}
BENCHMARK(BM_wait_ready)->Name("calls/wait_until/ready")->ArgNames({"bytes", "objects"})->Args({8, 0})->Args({8, 1000});

void BM_signal_op(benchmark::State& state) {
  Objects o(8, static_cast<int>(state.range(1)));
  for (auto _ : state) g_ctx->signal_op(o.sig.data(), 1, ubep::SignalOp::add, 0);
}
BENCHMARK(BM_signal_op)->Name("calls/signal_op")->ArgNames({"bytes", "objects"})->Args({8, 0})->Args({8, 1000});

void BM_fetch_add(benchmark::State& state) {
  Objects o(8, static_cast<int>(state.range(1)));
  for (auto _ : state) benchmark::DoNotOptimize(g_ctx->atomic_fetch_add(o.sig.data(), 1, 0));
}
BENCHMARK(BM_fetch_add)->Name("calls/atomic_fetch_add")->ArgNames({"bytes", "objects"})->Args({8, 0})->Args({8, 1000});

// --- dispatch_copy: the tokens for one peer into its region (the load/store route of moe::Layer) ---------
struct Tokens {
  std::size_t payload;
  int count;
  std::vector<std::byte> data;
  std::vector<int> order;  // the tokens of one batch: every other token, as a routing would pick them
  ubep::Symmetric<std::byte> region;
  Tokens(std::size_t hidden_bytes, int tokens)
      : payload(hidden_bytes), count(tokens), data(hidden_bytes * static_cast<std::size_t>(tokens), std::byte{3}) {
    for (int t = 0; t < tokens; t += 2) order.push_back(t);
    region = g_ctx->alloc<std::byte>(payload * order.size());
  }
};

void copy_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"token_bytes", "tokens"});
  for (int bytes : {256, 2048, 14336}) b->Args({bytes, 256});
}

void BM_copy_put_per_token(benchmark::State& state) {
  Tokens t(static_cast<std::size_t>(state.range(0)), static_cast<int>(state.range(1)));
  for (auto _ : state) {
    std::byte* row = t.region.data();
    for (int tok : t.order) {
      g_ctx->put(row, t.data.data() + static_cast<std::size_t>(tok) * t.payload, t.payload, 0);
      row += t.payload;
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * t.order.size()));
}
BENCHMARK(BM_copy_put_per_token)->Name("dispatch_copy/put_per_token")->Apply(copy_args);

void BM_copy_ptr_pack(benchmark::State& state) {
  Tokens t(static_cast<std::size_t>(state.range(0)), static_cast<int>(state.range(1)));
  for (auto _ : state) {
    std::byte* region = g_ctx->ptr(t.region.data(), t.region.size(), 0);
    ubep::moe::pack_tokens(t.order, t.data, {}, t.payload, region, t.payload);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * t.order.size()));
}
BENCHMARK(BM_copy_ptr_pack)->Name("dispatch_copy/ptr_pack")->Apply(copy_args);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  ubep::Options options = ubep::Options::from_env();
  ubep::Context ctx(MPI_COMM_WORLD, options);
  if (ctx.size() != 1) {
    if (ctx.rank() == 0) std::fprintf(stderr, "ubep_micro_calls: run it as one process, without mpirun\n");
    ctx.finalize();
    return 2;
  }
  g_ctx = &ctx;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_ctx = nullptr;
  ctx.finalize();
  return 0;
}
