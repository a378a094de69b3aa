// UBEP_GPU and host-only jobs in a CUDA build (issue 15): a Context with default options never initializes
// CUDA and moves bytes as in any build; Options::gpu (UBEP_GPU=1) brings CUDA up at Context() and, where a
// rank has no usable GPU, fails every rank's Context() together with the rank and CUDA's answer, after which
// a host-only Context works again. Registered plain and with the CUDA driver's link stub as libcuda.so.1 on
// the library path (tests/mpi/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>

#include "base/gpu.hpp"
#include "tests/mpi/test_util.hpp"
#include "ubep/ubep.hpp"

namespace ubep {
namespace {

// First in the file: nothing before it has asked for a GPU in this process.
TEST(GpuContext, HostOnlyJobNeverInitializesCuda) {
  ASSERT_FALSE(test::with_heap(4u << 20).gpu) << "run without UBEP_GPU";
  {
    Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
    auto buf = ctx.alloc<std::uint64_t>(4);
    const int peer = (ctx.rank() + 1) % ctx.size();
    const std::uint64_t v = 1000 + static_cast<std::uint64_t>(ctx.rank());
    ctx.put(buf.data() + 1, &v, sizeof v, peer);
    ctx.quiet();
    ctx.barrier();
    const int from = (ctx.rank() + ctx.size() - 1) % ctx.size();
    EXPECT_EQ(buf[1], 1000u + static_cast<std::uint64_t>(from));
    ctx.finalize();
  }
  EXPECT_FALSE(detail::gpu::asked()) << "a host-only Context initialized CUDA";
}

TEST(GpuContext, UbepGpuEitherBringsCudaUpOrFailsEveryRankTogether) {
  Options o = test::with_heap(4u << 20);
  o.gpu = true;
  // Whether this machine has a GPU, as every rank sees it (a job may mix hosts).
  int mine = gpu_status().available ? 1 : 0, all = 0;
  ASSERT_EQ(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), MPI_SUCCESS);
  if (all) {
    Context ctx(MPI_COMM_WORLD, o);
    EXPECT_TRUE(gpu_status().available);
    EXPECT_TRUE(detail::gpu::asked());
    ctx.finalize();
  } else {
    try {
      Context ctx(MPI_COMM_WORLD, o);
      ADD_FAILURE() << "Context() with UBEP_GPU=1 succeeded on a rank set without a GPU everywhere";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), Errc::unsupported) << what;
      int me = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &me);
      EXPECT_NE(what.find("rank " + std::to_string(me) + ": Context(): UBEP_GPU=1, but rank "), std::string::npos)
          << what;
      EXPECT_NE(what.find("has no usable GPU"), std::string::npos) << what;
      if (!mine) EXPECT_NE(what.find(gpu_status().reason), std::string::npos) << what;
    }
  }
  // Nothing is lost: a host-only Context works after it.
  Context ctx(MPI_COMM_WORLD, test::with_heap(4u << 20));
  auto word = ctx.alloc<std::uint64_t>(1);
  if (ctx.rank() == 0) word[0] = 0;
  ctx.barrier();
  ctx.atomic_add(word.data(), 1, 0);
  ctx.barrier();
  if (ctx.rank() == 0) EXPECT_EQ(ctx.atomic_fetch_add(word.data(), 0, 0), static_cast<std::uint64_t>(ctx.size()));
  ctx.finalize();
}

}  // namespace
}  // namespace ubep
