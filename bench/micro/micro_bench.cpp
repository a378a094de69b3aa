// Single-process micro-benchmarks (Google Benchmark) of ubep's CPU hot paths, no MPI:
//   pack/, regroup/, reduce/  the MoE layer's token pack, regroup and combine reduction: the very functions
//                             both layers call (moe/kernels.hpp), on the strides the layers use;
//   kernels/                  the owner's partial row per row-kernel path (portable, avx2, avx512) against
//                             memcpy of as many bytes, in GB/s of bytes read and written;
//   convert/                  the bf16 and e4m3 conversions of ubep/moe.hpp;
//   schedule/                 the all-to-all schedules of a synthetic 1024-rank Topology;
//   heap/                     the symmetric heap's allocator (runtime/heap.hpp), allocate/release patterns.
// docs/BENCHMARKS.md ("CPU micro-benchmarks") says how to run it; bench/micro/check_micro.py checks its JSON.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moe/handle.hpp"
#include "moe/kernels.hpp"
#include "runtime/heap.hpp"
#include "ubep/moe.hpp"
#include "ubep/topology.hpp"

namespace {

using ubep::moe::DType;

// The MoE shape: top-8 of 64 experts on 8 ranks (8 local experts each), uniform random routing.
constexpr int kTopk = 8, kRanks = 8, kExperts = 64;

struct Shape {
  DType dtype = DType::bf16;
  int hidden = 0, tokens = 0;
  bool operator==(const Shape&) const = default;
};

// The inputs of the last (family, shape) built, one at a time: Google Benchmark calls a benchmark function
// several times per shape (growing the iteration count), and building hundreds of MiB each time would
// dominate a short run; keeping every shape would hold GiBs.
struct Cache {
  std::shared_ptr<void> value;
  std::string family;
  Shape shape;
} g_cache;

template <class T, class Make>
T& cached(const char* family, const Shape& shape, Make make) {
  if (!g_cache.value || g_cache.family != family || !(g_cache.shape == shape)) {
    g_cache.value.reset();  // free the previous inputs first
    g_cache.value = std::make_shared<T>(make());
    g_cache.family = family;
    g_cache.shape = shape;
  }
  return *static_cast<T*>(g_cache.value.get());
}

ubep::moe::Config config_of(const Shape& s) {
  return {
      .num_experts = kExperts, .hidden = s.hidden, .dtype = s.dtype, .topk = kTopk, .max_tokens_per_rank = s.tokens};
}

// Cheap deterministic bytes (filling hundreds of MiB through std::mt19937 would take seconds).
void fill_bytes(std::vector<std::byte>& v, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::byte& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
}

// One call's send plan, as LayerImpl::dispatch_send builds it: per (t, a) the expert, weight and position
// in its batch; per (dest, local expert) the batch's tokens and its offset in the combine buffer.
struct Plan {
  ubep::moe::ExpertMap map{kExperts, kRanks};
  std::vector<int> idx, pos;
  std::vector<float> weights;
  std::vector<std::vector<int>> batches;  // [ranks x max_local]
  std::vector<std::size_t> coffset;       // [ranks x max_local]
  std::size_t rows = 0;                   // n x topk
};

Plan make_plan(int n, unsigned seed) {
  Plan p;
  const int L = p.map.max_local();
  p.batches.assign(static_cast<std::size_t>(kRanks) * L, {});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  std::vector<int> experts(kExperts);
  std::iota(experts.begin(), experts.end(), 0);
  for (int t = 0; t < n; ++t) {
    for (int a = 0; a < kTopk; ++a) {  // k distinct experts: a partial Fisher-Yates shuffle
      std::swap(experts[a], experts[a + static_cast<int>(rng() % (kExperts - a))]);
      const int e = experts[a], d = p.map.owner(e);
      auto& batch = p.batches[static_cast<std::size_t>(d) * L + (e - p.map.first(d))];
      p.idx.push_back(e);
      p.pos.push_back(static_cast<int>(batch.size()));
      p.weights.push_back(weight(rng));
      batch.push_back(t);
    }
  }
  for (const auto& batch : p.batches) {
    p.coffset.push_back(p.rows);
    p.rows += batch.size();
  }
  return p;
}

void moe_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"hidden", "tokens"});
  for (int hidden : {4096, 7168}) {
    for (int tokens : {256, 4096}) b->Args({hidden, tokens});
  }
  b->Unit(benchmark::kMicrosecond);
}

Shape shape_of(const benchmark::State& state, DType dtype) {
  return {dtype, static_cast<int>(state.range(0)), static_cast<int>(state.range(1))};
}

// Bytes of a token's elements, and of its row in the layers' buffers (payload + e4m3 scale, padded).
struct Rows {
  std::size_t payload = 0, stride = 0;
};
Rows rows_of(const Shape& s) {
  const auto c = config_of(s);
  return {static_cast<std::size_t>(c.hidden) * ubep::moe::element_size(c.dtype), ubep::moe::token_stride(c)};
}

// Per iteration: `items` tokens and `bytes` bytes.
void set_rates(benchmark::State& state, std::size_t items, std::size_t bytes) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * items));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

// --- pack: the tokens a rank sends to one peer ---------------------------------------------------------
// `tokens` tokens on this rank, top-8 of 64 experts on 8 ranks: about `tokens` rows go to each peer. One
// iteration packs every batch (local expert) of peer 0 at token_stride into its staging region, as the
// mpi route of moe::OneSidedImpl::send does per peer (BspLayer packs every peer alike).
struct PackInput {
  Plan plan;
  std::vector<std::byte> tokens, staging;
  std::vector<float> scales;
  Rows layout;
  std::size_t rows = 0;
};

void BM_pack(benchmark::State& state, DType dtype) {
  const Shape shape = shape_of(state, dtype);
  PackInput& in = cached<PackInput>("pack", shape, [&] {
    PackInput p;
    p.plan = make_plan(shape.tokens, 1);
    p.layout = rows_of(shape);
    p.tokens.resize(static_cast<std::size_t>(shape.tokens) * p.layout.payload);
    fill_bytes(p.tokens, 2);
    if (dtype == DType::e4m3) p.scales.assign(shape.tokens, 0.5f);
    for (int le = 0; le < p.plan.map.max_local(); ++le) p.rows += p.plan.batches[le].size();
    p.staging.resize(p.rows * p.layout.stride);
    return p;
  });
  const int L = in.plan.map.max_local();
  const auto [payload, stride] = in.layout;
  for (auto _ : state) {
    std::byte* row = in.staging.data();
    for (int le = 0; le < L; ++le) {
      const std::vector<int>& toks = in.plan.batches[le];  // peer 0, local expert le
      ubep::moe::pack_tokens(toks, in.tokens, in.scales, payload, row, stride);
      row += toks.size() * stride;
    }
    benchmark::ClobberMemory();
  }
  set_rates(state, in.rows, in.rows * payload);
}
BENCHMARK_CAPTURE(BM_pack, bf16, DType::bf16)->Name("pack/bf16")->Apply(moe_shapes);
BENCHMARK_CAPTURE(BM_pack, e4m3, DType::e4m3)->Name("pack/e4m3")->Apply(moe_shapes);

// --- regroup: one local expert's tokens out of the received blocks --------------------------------------
// `tokens` tokens for one local expert, from 8 sources (uneven counts), each source's rows at token_stride
// in its own receive region after those of the source's earlier experts; one iteration copies them into
// one contiguous [tokens x hidden] array (plus the e4m3 scales), as LayerImpl::regroup does.
struct RegroupInput {
  std::vector<int> counts;
  std::vector<std::vector<std::byte>> regions;
  std::vector<const std::byte*> blocks;
  std::vector<std::byte> data;
  std::vector<float> scales;
  Rows layout;
};

void BM_regroup(benchmark::State& state, DType dtype) {
  const Shape shape = shape_of(state, dtype);
  RegroupInput& in = cached<RegroupInput>("regroup", shape, [&] {
    RegroupInput r;
    r.layout = rows_of(shape);
    const std::size_t stride = r.layout.stride;
    // Source s sends (s + 4) / sum shares of the tokens; the last source takes the rest.
    int left = shape.tokens;
    for (int s = 0; s < kRanks; ++s) {
      const int c_s = s + 1 < kRanks ? shape.tokens * (s + 4) / (kRanks * (kRanks + 7) / 2) : left;
      r.counts.push_back(c_s);
      left -= c_s;
      const std::size_t earlier = static_cast<std::size_t>(s) * 3;  // rows of the source's earlier experts
      r.regions.emplace_back((earlier + c_s) * stride);
      fill_bytes(r.regions.back(), 10 + s);
      r.blocks.push_back(r.regions.back().data() + earlier * stride);
    }
    r.data.resize(static_cast<std::size_t>(shape.tokens) * r.layout.payload);
    if (dtype == DType::e4m3) r.scales.resize(shape.tokens);
    return r;
  });
  float* scales = in.scales.empty() ? nullptr : in.scales.data();
  const auto [payload, stride] = in.layout;
  for (auto _ : state) {
    ubep::moe::regroup_tokens(in.counts, in.blocks, stride, payload, in.data.data(), scales);
    benchmark::ClobberMemory();
  }
  set_rates(state, static_cast<std::size_t>(shape.tokens), static_cast<std::size_t>(shape.tokens) * payload);
}
BENCHMARK_CAPTURE(BM_regroup, bf16, DType::bf16)->Name("regroup/bf16")->Apply(moe_shapes);
BENCHMARK_CAPTURE(BM_regroup, e4m3, DType::e4m3)->Name("regroup/e4m3")->Apply(moe_shapes);

// --- reduce: the combine's weighted sum back into token order -------------------------------------------
// `tokens` tokens x top-8 expert outputs of output_dtype (bf16 for bf16 and e4m3 dispatch, f32 for f32) in
// the combine buffer, laid out dest-major by the plan; one iteration writes out[t] = sum_k w * y, as
// LayerImpl::reduce (combine_recv) does. The combine buffer holds tokens x 8 rows: shapes stay <= 1024.
struct ReduceInput {
  Plan plan;
  std::vector<std::byte> combine;
  std::vector<float> out;
  std::size_t row_bytes = 0;
};

void reduce_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"hidden", "tokens"});
  for (int hidden : {4096, 7168}) {
    for (int tokens : {256, 1024}) b->Args({hidden, tokens});
  }
  b->Unit(benchmark::kMicrosecond);
}

void BM_reduce(benchmark::State& state, DType dtype) {
  const Shape shape = shape_of(state, dtype);
  ReduceInput& in = cached<ReduceInput>("reduce", shape, [&] {
    ReduceInput r;
    r.plan = make_plan(shape.tokens, 3);
    r.row_bytes = ubep::moe::output_stride(config_of(shape));
    r.combine.resize(r.plan.rows * r.row_bytes);
    if (dtype == DType::f32) {
      std::vector<float> v(r.combine.size() / 4);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 251) * 0.01f - 1.0f;
      std::memcpy(r.combine.data(), v.data(), r.combine.size());
    } else {
      std::vector<std::uint16_t> v(r.combine.size() / 2);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = ubep::moe::float_to_bf16(static_cast<float>(i % 251) * 0.01f);
      std::memcpy(r.combine.data(), v.data(), r.combine.size());
    }
    r.out.resize(static_cast<std::size_t>(shape.tokens) * shape.hidden);
    return r;
  });
  const bool f32 = ubep::moe::output_dtype(dtype) == DType::f32;
  const std::vector<const std::byte*> batches = ubep::moe::batches_at(in.plan.coffset, in.combine.data(), in.row_bytes);
  for (auto _ : state) {
    ubep::moe::reduce_outputs(in.plan.map, kTopk, in.plan.idx, in.plan.weights, in.plan.pos, batches, in.row_bytes, f32,
                              static_cast<std::size_t>(shape.hidden), in.out);
    benchmark::ClobberMemory();
  }
  set_rates(state, static_cast<std::size_t>(shape.tokens), in.combine.size());
}
BENCHMARK_CAPTURE(BM_reduce, bf16, DType::bf16)->Name("reduce/bf16")->Apply(reduce_shapes);
BENCHMARK_CAPTURE(BM_reduce, f32, DType::f32)
    ->Name("reduce/f32")
    ->ArgNames({"hidden", "tokens"})
    ->Args({4096, 256})
    ->Unit(benchmark::kMicrosecond);

// --- kernels: the reductions per row-kernel path, against memcpy ---------------------------------------
// One iteration runs, for `tokens` tokens of hidden 7168, the owner's partial row of top-8 bf16 expert
// outputs (partial_row: 8 rows read, one bf16 row written) under one path (portable, avx2, avx512: those this
// CPU runs, forced with set_active_path), or memcpy of the same bytes. Bytes per second count every byte read
// and written (memcpy: its source and its destination), so the GB/s of a kernel and of memcpy compare: a
// kernel at memcpy's rate runs at the memory's speed. 512 tokens: 58 MiB of rows, beyond the caches.
constexpr int kKernelHidden = 7168, kKernelTokens = 512, kKernelRows = 8;

struct KernelInput {
  std::vector<std::uint16_t> y, out;
  std::vector<std::byte> src, dst;  // memcpy: bytes read and written as partial_row reads and writes
};

std::size_t kernel_bytes() {  // read + written per iteration
  return static_cast<std::size_t>(kKernelTokens) * kKernelHidden * 2 * (kKernelRows + 1);
}

KernelInput& kernel_input() {
  return cached<KernelInput>("kernels", Shape{DType::bf16, kKernelHidden, kKernelTokens}, [] {
    KernelInput k;
    const std::size_t rows = static_cast<std::size_t>(kKernelTokens) * kKernelRows;
    k.y.resize(rows * kKernelHidden);
    for (std::size_t i = 0; i < k.y.size(); ++i) k.y[i] = ubep::moe::float_to_bf16(static_cast<float>(i % 251) * 0.01f);
    k.out.resize(static_cast<std::size_t>(kKernelTokens) * kKernelHidden);
    k.src.resize(kernel_bytes() / 2);  // memcpy reads and writes as many bytes as partial_row moves
    k.dst.resize(k.src.size());
    return k;
  });
}

void BM_partial_row(benchmark::State& state, ubep::moe::KernelPath path) {
  KernelInput& in = kernel_input();
  const ubep::moe::KernelPath before = ubep::moe::active_path();
  ubep::moe::set_active_path(path);
  const float w[kKernelRows] = {0.31f, 0.12f, 0.09f, 0.2f, 0.05f, 0.08f, 0.1f, 0.05f};
  const std::size_t row = kKernelHidden;
  for (auto _ : state) {
    for (int t = 0; t < kKernelTokens; ++t) {
      const std::byte* y[kKernelRows];
      for (int a = 0; a < kKernelRows; ++a)
        y[a] = reinterpret_cast<const std::byte*>(in.y.data() + (static_cast<std::size_t>(t) * kKernelRows + a) * row);
      ubep::moe::partial_row(w, y, false, row, false, reinterpret_cast<std::byte*>(in.out.data() + t * row));
    }
    benchmark::ClobberMemory();
  }
  ubep::moe::set_active_path(before);
  set_rates(state, kKernelTokens, kernel_bytes());
}

void BM_kernel_memcpy(benchmark::State& state) {
  KernelInput& in = kernel_input();
  for (auto _ : state) {
    std::memcpy(in.dst.data(), in.src.data(), in.src.size());
    benchmark::ClobberMemory();
  }
  set_rates(state, kKernelTokens, 2 * in.src.size());
}

// The paths this CPU runs, registered at start-up (an unsupported path would be an error, not a skip).
const bool g_kernel_benchmarks = [] {
  for (const auto p : {ubep::moe::KernelPath::portable, ubep::moe::KernelPath::avx2, ubep::moe::KernelPath::avx512}) {
    if (!ubep::moe::supported(p)) continue;
    benchmark::RegisterBenchmark((std::string("kernels/partial_row/") + ubep::moe::to_string(p)).c_str(),
                                 BM_partial_row, p)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("kernels/memcpy", BM_kernel_memcpy)->Unit(benchmark::kMicrosecond);
  return true;
}();

// --- convert: bf16 and e4m3 conversions, one token's elements (hidden 7168) per iteration ---------------
constexpr int kConvertElements = 7168;

std::vector<float> convert_input() {
  std::mt19937 rng(5);
  std::normal_distribution<float> value(0.0f, 64.0f);  // spans e4m3's normal range and saturation at 448
  std::vector<float> v(kConvertElements);
  for (float& x : v) x = value(rng);
  return v;
}

// convert_input() encoded by `encode`: the input of a decoding benchmark.
template <class T, class Encode>
std::vector<T> encoded(Encode encode) {
  std::vector<T> v;
  for (float x : convert_input()) v.push_back(encode(x));
  return v;
}

template <class To, class From, class Convert>
void run_convert(benchmark::State& state, const std::vector<From>& in, Convert convert) {
  std::vector<To> out(in.size());
  for (auto _ : state) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = convert(in[i]);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * in.size()));
}

void BM_float_to_bf16(benchmark::State& state) {
  run_convert<std::uint16_t>(state, convert_input(), ubep::moe::float_to_bf16);
}
void BM_bf16_to_float(benchmark::State& state) {
  run_convert<float>(state, encoded<std::uint16_t>(ubep::moe::float_to_bf16), ubep::moe::bf16_to_float);
}
void BM_float_to_e4m3(benchmark::State& state) {
  run_convert<std::uint8_t>(state, convert_input(), ubep::moe::float_to_e4m3);
}
void BM_e4m3_to_float(benchmark::State& state) {
  run_convert<float>(state, encoded<std::uint8_t>(ubep::moe::float_to_e4m3), ubep::moe::e4m3_to_float);
}
BENCHMARK(BM_float_to_bf16)->Name("convert/float_to_bf16")->Arg(kConvertElements)->ArgName("elements");
BENCHMARK(BM_bf16_to_float)->Name("convert/bf16_to_float")->Arg(kConvertElements)->ArgName("elements");
BENCHMARK(BM_float_to_e4m3)->Name("convert/float_to_e4m3")->Arg(kConvertElements)->ArgName("elements");
BENCHMARK(BM_e4m3_to_float)->Name("convert/e4m3_to_float")->Arg(kConvertElements)->ArgName("elements");

// --- schedule: the all-to-all order of one rank among 1024 ----------------------------------------------
// 128 nodes x 2 packages x 4 bound ranks (one NUMA node and L3 per package, one core per rank), nodes on
// 16 leaf switches of 8: every distance class from core to system is present. One iteration computes
// ubep::schedule for one rank (a different one each iteration), as every rank does once per Context.
constexpr int kNodes = 128, kPackages = 2, kPerPackage = 4, kNodesPerSwitch = 8;

std::vector<ubep::RankPlace> synthetic_places() {
  std::vector<ubep::RankPlace> places;
  for (int node = 0; node < kNodes; ++node) {
    for (int l = 0; l < kPackages * kPerPackage; ++l) {
      ubep::RankPlace p;
      p.rank = static_cast<int>(places.size());
      p.node = node;
      p.host = "node" + std::to_string(node);
      p.bound = true;
      p.package = p.numa = p.l3 = l / kPerPackage;
      p.core = p.pu = l;
      places.push_back(std::move(p));
    }
  }
  return places;
}

std::vector<std::vector<int>> synthetic_switch_hops() {
  std::vector<std::vector<int>> hops(kNodes, std::vector<int>(kNodes, 2));
  for (int a = 0; a < kNodes; ++a) {
    for (int b = 0; b < kNodes; ++b) {
      if (a == b) hops[a][b] = 0;
      if (a != b && a / kNodesPerSwitch == b / kNodesPerSwitch) hops[a][b] = 1;
    }
  }
  return hops;
}

const ubep::Topology& synthetic_topology() {
  static const ubep::Topology topo(synthetic_places(), synthetic_switch_hops());
  return topo;
}

void BM_schedule(benchmark::State& state, ubep::ScheduleKind kind) {
  const ubep::Topology& topo = synthetic_topology();
  int rank = 0;
  for (auto _ : state) {
    std::vector<int> order = ubep::schedule(topo, rank, kind);
    benchmark::DoNotOptimize(order.data());
    rank = (rank + 131) % topo.size();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * topo.size()));
}
BENCHMARK_CAPTURE(BM_schedule, linear, ubep::ScheduleKind::linear)
    ->Name("schedule/linear")
    ->Arg(kNodes* kPackages* kPerPackage)
    ->ArgName("ranks")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_schedule, shifted, ubep::ScheduleKind::shifted)
    ->Name("schedule/shifted")
    ->Arg(kNodes* kPackages* kPerPackage)
    ->ArgName("ranks")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_schedule, topology, ubep::ScheduleKind::topology)
    ->Name("schedule/topology")
    ->Arg(kNodes* kPackages* kPerPackage)
    ->ArgName("ranks")
    ->Unit(benchmark::kMicrosecond);

// The distance-class and cost matrices of all 1024 x 1024 pairs: what the Context builds once.
void BM_topology_build(benchmark::State& state) {
  const std::vector<ubep::RankPlace> places = synthetic_places();
  const std::vector<std::vector<int>> hops = synthetic_switch_hops();
  for (auto _ : state) {
    ubep::Topology topo(places, hops);
    benchmark::DoNotOptimize(&topo);
  }
}
BENCHMARK(BM_topology_build)
    ->Name("schedule/build_topology")
    ->Arg(kNodes* kPackages* kPerPackage)
    ->ArgName("ranks")
    ->Unit(benchmark::kMillisecond);

// --- heap: the symmetric heap's first-fit allocator -----------------------------------------------------
// One iteration allocates `blocks` blocks (sizes 64 B .. 1 MiB by a fixed pattern, 64 B aligned, one in four
// page aligned) from a fresh 64 GiB range and releases them: `lifo` newest first (the usual scope order),
// `interleaved` every other block first, then allocates half as many again into the holes (first fit
// over a fragmented free list) and releases everything oldest first.
std::size_t heap_size_of(std::size_t i) { return std::size_t{64} << ((i * 7) % 15); }
std::size_t heap_align_of(std::size_t i) { return i % 4 == 3 ? 4096 : 64; }

void allocate_blocks(ubep::detail::HeapAllocator& heap, std::vector<std::size_t>& offsets, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const auto off = heap.allocate(heap_size_of(i), heap_align_of(i));
    offsets.push_back(off.value());
  }
}

void BM_heap_lifo(benchmark::State& state) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  std::vector<std::size_t> offsets;
  offsets.reserve(blocks);
  for (auto _ : state) {
    ubep::detail::HeapAllocator heap(0, std::size_t{64} << 30);
    offsets.clear();
    allocate_blocks(heap, offsets, blocks);
    for (auto it = offsets.rbegin(); it != offsets.rend(); ++it) benchmark::DoNotOptimize(heap.release(*it));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * 2 * blocks));
}

void BM_heap_interleaved(benchmark::State& state) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  std::vector<std::size_t> offsets, kept;
  for (auto _ : state) {
    ubep::detail::HeapAllocator heap(0, std::size_t{64} << 30);
    offsets.clear();
    kept.clear();
    allocate_blocks(heap, offsets, blocks);
    for (std::size_t i = 0; i < offsets.size(); ++i) {
      if (i % 2 == 0) {
        benchmark::DoNotOptimize(heap.release(offsets[i]));
      } else {
        kept.push_back(offsets[i]);
      }
    }
    allocate_blocks(heap, kept, blocks / 2);
    for (std::size_t off : kept) benchmark::DoNotOptimize(heap.release(off));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * (2 * blocks + 2 * (blocks / 2))));
}
// alloc_signals(1) in a loop: many 8-byte objects, every other one freed, the holes filled again (issue 14:
// first fit over unrounded sizes made this quadratic, 117 s for 131 072 signals on 2 ranks).
void BM_heap_small_objects(benchmark::State& state) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  std::vector<std::size_t> offsets;
  for (auto _ : state) {
    ubep::detail::HeapAllocator heap(0, std::size_t{64} << 30);
    offsets.clear();
    for (std::size_t i = 0; i < blocks; ++i) offsets.push_back(heap.allocate(8, 64).value());
    for (std::size_t i = 0; i < blocks; i += 2) benchmark::DoNotOptimize(heap.release(offsets[i]));
    for (std::size_t i = 0; i < blocks; i += 2) offsets[i] = heap.allocate(8, 64).value();
    for (std::size_t off : offsets) benchmark::DoNotOptimize(heap.release(off));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * 3 * blocks));
}

BENCHMARK(BM_heap_lifo)->Name("heap/lifo")->ArgName("blocks")->Arg(16)->Arg(256)->Arg(16384);
BENCHMARK(BM_heap_interleaved)->Name("heap/interleaved")->ArgName("blocks")->Arg(16)->Arg(256)->Arg(16384);
BENCHMARK(BM_heap_small_objects)->Name("heap/small_objects")->ArgName("blocks")->Arg(16384);

}  // namespace
