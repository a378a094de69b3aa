// moe::Layer and moe::BspLayer on GPU memory (moe.hpp, "Device memory"; docs/GPU.md "GPUs"), public headers only:
//   MoeDevice.Parse*, UnknownMemoryIsRejected, MemoryMustAgree   the Config::memory field and its checks;
//   MoeDevice.WithoutAGpuEveryRankFailsTogether   without a GPU every rank's constructor throws
//                              Errc::unsupported, the context stays usable, a host-memory layer still works;
//   MoeDeviceCalls.MatchesHostBitForBit   on a GPU heap EMULATED in host memory (UBEP_GPU_EMULATE: every route
//                              and rank count here) and on a real GPU (tests/gpu/check.sh): every dtype and
//                              combine mode, inputs in GPU memory (and in host memory), two calls in flight,
//                              expert batches read from GPU memory, sums written to GPU memory; outputs bit
//                              for bit those of the host-memory layers and the serial reference;
//                              device_buffer_bytes() as documented.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tests/mpi/gpu_heap_fixture.hpp"
#include "tests/mpi/moe_reference.hpp"
#include "tests/mpi/test_util.hpp"
#include "ubep/config.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

using moe::Combine;
using moe::Config;
using moe::DType;
using moe::Memory;

using test::gpu_everywhere;

Config config(DType dt, Combine mode, Memory memory) {
  Config c;
  c.num_experts = 5;
  c.hidden = 12;
  c.dtype = dt;
  c.topk = 2;
  c.max_tokens_per_rank = 6;
  c.combine = mode;
  c.memory = memory;
  return c;
}

Options opts(bool emulate) {
  Options o = test::with_heap(32u << 20);
  o.gpu_heap_size = std::size_t{16} << 20;
  o.gpu_emulate = emulate;
  o.run_ahead = 2;
  return o;
}

TEST(MoeDevice, ParseAndPrintMemory) {
  EXPECT_EQ(moe::parse_memory("host"), Memory::host);
  EXPECT_EQ(moe::parse_memory("device"), Memory::device);
  EXPECT_STREQ(moe::to_string(Memory::device), "device");
  EXPECT_STREQ(moe::to_string(Memory::host), "host");
  test::expect_error(Errc::invalid_argument, [] { (void)moe::parse_memory("gpu"); }, {"'gpu'", "host, device"});
  EXPECT_EQ(Config{}.memory, Memory::host);
}

TEST(MoeDevice, UnknownMemoryIsRejected) {
  Context ctx(MPI_COMM_WORLD, opts(true));
  Config c = config(DType::bf16, Combine::per_rank, static_cast<Memory>(7));
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": ";
  test::expect_error(Errc::invalid_argument, [&] { moe::Layer l(ctx, c); }, {me, "memory=7", "host=0, device=1"});
  test::expect_error(Errc::invalid_argument, [&] { moe::BspLayer l(ctx, c); }, {me, "memory=7"});
  ctx.finalize();
}

TEST(MoeDevice, MemoryMustAgree) {
  Context ctx(MPI_COMM_WORLD, opts(true));
  const Config c = config(DType::f32, Combine::per_expert, ctx.rank() == 0 ? Memory::device : Memory::host);
  test::expect_error(Errc::collective_mismatch, [&] { moe::Layer l(ctx, c); }, {"memory"});
  test::expect_error(Errc::collective_mismatch, [&] { moe::BspLayer l(ctx, c); }, {"memory"});
  EXPECT_NE(ctx.info().gpu_heap.find("not created"), std::string::npos) << "a refused layer created the GPU heap";
  ctx.finalize();
}

TEST(MoeDevice, WithoutAGpuEveryRankFailsTogether) {
  if (gpu_everywhere()) GTEST_SKIP() << "a GPU on every rank: MoeDeviceCalls.*/cuda runs instead";
  Context ctx(MPI_COMM_WORLD, opts(false));
  const Config dev = config(DType::bf16, Combine::per_node, Memory::device);
  const std::string me = "rank " + std::to_string(ctx.rank()) + ": alloc_device: ";
  test::expect_error(Errc::unsupported, [&] { moe::Layer l(ctx, dev); }, {me});
  test::expect_error(Errc::unsupported, [&] { moe::BspLayer l(ctx, dev); }, {me});
  // The context and a host-memory layer still work.
  const Config host = config(DType::bf16, Combine::per_node, Memory::host);
  moe::Layer layer(ctx, host);
  const test::Input in = test::make_input(host, ctx.rank(), ctx.size(), test::Routing::uniform, 3);
  moe::Handle h = layer.dispatch(in.tokens, in.idx, in.weights, in.scales);
  const std::size_t ob = host.hidden * moe::element_size(moe::output_dtype(host.dtype));
  while (auto le = layer.next_expert(h)) {
    const moe::ExpertTokens t = layer.expert_tokens(h, *le);
    std::vector<std::byte> out(static_cast<std::size_t>(t.count) * ob);
    for (int j = 0; j < t.count; ++j)
      test::expert_fn(host, t.expert, t.data.data() + j * host.hidden * moe::element_size(host.dtype), 1.0f,
                      out.data() + j * ob);
    layer.combine_send(h, *le, out);
  }
  std::vector<float> sums(static_cast<std::size_t>(in.n) * host.hidden);
  layer.combine_recv(h, sums);
  EXPECT_TRUE(test::bit_identical(sums, test::reference(ctx, host, in))) << "rank " << ctx.rank();
  ctx.finalize();
}

// ---- the calls on GPU memory ---------------------------------------------------------------------

using test::Heap;

class MoeDeviceCalls : public test::GpuHeapFixture {};

/// One rank's input of one call, in GPU memory (objects of the GPU heap sized for max_tokens_per_rank) or,
/// for `host_inputs`, the host vectors themselves.
struct DeviceInput {
  Symmetric<std::byte> tokens;
  Symmetric<int> idx;
  Symmetric<float> weights, scales;
};

TEST_P(MoeDeviceCalls, MatchesHostBitForBit) {
  Context ctx(MPI_COMM_WORLD, with_gpu_heap(opts(true), std::size_t{16} << 20));
  const int me = ctx.rank(), P = ctx.size();
  unsigned seed = 11;
  for (const DType dt : {DType::f32, DType::bf16, DType::e4m3}) {
    for (const Combine mode : {Combine::per_expert, Combine::per_rank, Combine::per_node}) {
      const Config host = config(dt, mode, Memory::host);
      const Config dev = config(dt, mode, Memory::device);
      const std::string what = std::string("rank ") + std::to_string(me) + " of " + std::to_string(P) + ": " +
                               moe::to_string(dt) + " " + moe::to_string(mode);
      const std::size_t tb = dev.hidden * moe::element_size(dev.dtype);
      const std::size_t ob = dev.hidden * moe::element_size(moe::output_dtype(dev.dtype));
      const std::size_t n_max = static_cast<std::size_t>(dev.max_tokens_per_rank);
      moe::Layer ubep_host(ctx, host), ubep_dev(ctx, dev);
      moe::BspLayer bsp_host(ctx, host), bsp_dev(ctx, dev);
      // As documented: per call in flight, ranks x max_tokens x min(topk, local experts) rows, then the scales,
      // each rounded up to 256 bytes.
      const std::size_t rows = static_cast<std::size_t>(P) * n_max *
                               static_cast<std::size_t>(std::min(dev.topk, ubep_dev.experts().max_local()));
      const std::size_t round = 256;
      const std::size_t set = (rows * tb + round - 1) / round * round +
                              (dt == DType::e4m3 ? (rows * sizeof(float) + round - 1) / round * round : 0);
      EXPECT_EQ(ubep_dev.device_buffer_bytes(), 2 * set) << what;
      EXPECT_EQ(bsp_dev.device_buffer_bytes(), 2 * set) << what;
      EXPECT_EQ(ubep_host.device_buffer_bytes(), 0u) << what;

      // Two calls in flight, on inputs in GPU memory (call 0) and in host memory (call 1).
      const test::Input in[2] = {test::make_input(host, me, P, test::Routing::uniform, seed++),
                                 test::make_input(host, me, P, test::Routing::zipf, seed++)};
      DeviceInput d{ctx.alloc_device<std::byte>(n_max * tb), ctx.alloc_device<int>(n_max * dev.topk),
                    ctx.alloc_device<float>(n_max * dev.topk), ctx.alloc_device<float>(n_max)};
      copy_raw(d.tokens.data(), in[0].tokens.data(), in[0].tokens.size());
      copy_raw(d.idx.data(), in[0].idx.data(), in[0].idx.size() * sizeof(int));
      copy_raw(d.weights.data(), in[0].weights.data(), in[0].weights.size() * sizeof(float));
      copy_raw(d.scales.data(), in[0].scales.data(), in[0].scales.size() * sizeof(float));
      const int L = ubep_dev.experts().max_local();
      // Expert outputs in GPU memory: per local expert room for every row it can receive.
      auto outputs = ctx.alloc_device<std::byte>(static_cast<std::size_t>(std::max(L, 1)) * P * n_max * ob);
      auto sums = ctx.alloc_device<float>(2 * n_max * dev.hidden);

      for (moe::LayerBase* layers : std::initializer_list<moe::LayerBase*>{&ubep_dev, &bsp_dev}) {
        moe::LayerBase& layer = *layers;
        moe::Handle h[2];
        h[0] = layer.dispatch_send(std::span<const std::byte>(d.tokens.data(), in[0].tokens.size()),
                                   std::span<const int>(d.idx.data(), in[0].idx.size()),
                                   std::span<const float>(d.weights.data(), in[0].weights.size()),
                                   std::span<const float>(d.scales.data(), in[0].scales.size()));
        h[1] = layer.dispatch_send(in[1].tokens, in[1].idx, in[1].weights, in[1].scales);
        // Every batch of both calls handed out first (the newer call's first), then computed: each stays valid
        // in GPU memory until its call's combine_recv, as a grouped GEMM over all experts would read them.
        std::vector<std::pair<int, moe::ExpertTokens>> batches;
        for (int c = 1; c >= 0; --c) {
          while (auto le = layer.next_expert(h[c])) batches.emplace_back(c, layer.expert_tokens(h[c], *le));
        }
        for (const auto& [c, t] : batches) {
          // The batch is in GPU memory: copy it out, compute on the host, copy the outputs back.
          std::vector<std::byte> batch(t.data.size());
          std::vector<float> scales(t.scales.size());
          copy_raw(batch.data(), t.data.data(), batch.size());
          copy_raw(scales.data(), t.scales.data(), scales.size() * sizeof(float));
          std::vector<std::byte> out(static_cast<std::size_t>(t.count) * ob);
          for (int j = 0; j < t.count; ++j)
            test::expert_fn(dev, t.expert, batch.data() + j * tb, scales.empty() ? 1.0f : scales[j],
                            out.data() + j * ob);
          std::byte* gpu_out = outputs.data() + static_cast<std::size_t>(t.local) * P * n_max * ob;
          copy_raw(gpu_out, out.data(), out.size());
          layer.combine_send(h[c], t.local, std::span<const std::byte>(gpu_out, out.size()));
          // A second expert_tokens call hands out the same GPU rows (no second copy).
          EXPECT_EQ(layer.expert_tokens(h[c], t.local).data.data(), t.data.data()) << what;
        }
        std::vector<float> got[2];
        for (int c = 0; c < 2; ++c) {
          const std::size_t count = static_cast<std::size_t>(in[c].n) * dev.hidden;
          float* gpu_sums = sums.data() + static_cast<std::size_t>(c) * n_max * dev.hidden;
          layer.combine_recv(h[c], std::span<float>(gpu_sums, count));
          got[c].resize(count);
          copy_raw(got[c].data(), gpu_sums, count * sizeof(float));
        }
        // Then (no call of `layer` in flight) the host-memory layer of the same implementation and mode, and
        // the serial reference.
        moe::LayerBase& twin = &layer == &ubep_dev ? static_cast<moe::LayerBase&>(ubep_host) : bsp_host;
        for (int c = 0; c < 2; ++c) {
          moe::Handle th = twin.dispatch(in[c].tokens, in[c].idx, in[c].weights, in[c].scales);
          while (auto le = twin.next_expert(th)) {
            const moe::ExpertTokens t = twin.expert_tokens(th, *le);
            std::vector<std::byte> out(static_cast<std::size_t>(t.count) * ob);
            for (int j = 0; j < t.count; ++j)
              test::expert_fn(host, t.expert, t.data.data() + j * tb, t.scales.empty() ? 1.0f : t.scales[j],
                              out.data() + j * ob);
            twin.combine_send(th, *le, out);
          }
          std::vector<float> want(got[c].size());
          twin.combine_recv(th, want);
          EXPECT_TRUE(test::bit_identical(got[c], want))
              << what << ": " << layer.name() << " on GPU memory differs from host memory, call " << c;
          EXPECT_TRUE(test::bit_identical(got[c], test::reference(ctx, host, in[c])))
              << what << ": " << layer.name() << " on GPU memory differs from the serial reference, call " << c;
        }
      }
    }
  }
  ctx.finalize();
}

INSTANTIATE_TEST_SUITE_P(Heaps, MoeDeviceCalls, ::testing::Values(Heap::emulated, Heap::cuda), test::heap_name);

}  // namespace
}  // namespace ubep
