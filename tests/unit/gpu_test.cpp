// ubep::gpu_status() and the lazy CUDA initialization, on whatever machine runs it: the CI machines have the
// CUDA Toolkit and no driver (35), or the driver's link stub on the library path (34 where the loader finds
// it), or CUDA_VISIBLE_DEVICES empty (100); a GPU machine answers with its devices. CTest runs this file in
// those three environments (tests/CMakeLists.txt).
#include "base/gpu.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "base/gpu_driver.hpp"
#include "topology/local.hpp"
#include "ubep/config.hpp"
#include "ubep/error.hpp"
#include "ubep/gpu.hpp"

namespace {

// One test, in order: a process that has not asked has not initialized CUDA, even after discovering its host
// (topology takes GPU locality from hwloc then); the first gpu_status() asks; the answer is consistent.
TEST(Gpu, NothingAsksCudaUntilGpuStatusAndItsAnswerIsConsistent) {
  EXPECT_FALSE(ubep::detail::gpu::asked());
  const auto layout = ubep::detail::HostLayout::load_this_host();
  (void)layout;
  EXPECT_FALSE(ubep::detail::gpu::asked()) << "discovering this host initialized CUDA";

  const ubep::GpuStatus& s = ubep::gpu_status();
  EXPECT_TRUE(ubep::detail::gpu::asked());
  EXPECT_EQ(s.built, UBEP_HAVE_CUDA == 1);
  EXPECT_FALSE(s.reason.empty());
  EXPECT_EQ(s.available, s.devices > 0);
  if (!s.built) {
    EXPECT_FALSE(s.available);
    EXPECT_EQ(s.reason, "built without CUDA");
  } else if (s.available) {
    EXPECT_EQ(s.cuda_error, 0);
    EXPECT_NE(s.reason.find(std::to_string(s.devices) + " device"), std::string::npos) << s.reason;
  } else {
    EXPECT_NE(s.cuda_error, 0);
    EXPECT_NE(s.reason.find("cudaGetDeviceCount returned " + std::to_string(s.cuda_error) + " ("), std::string::npos)
        << s.reason;
    const bool ordinary = s.cuda_error == 34 || s.cuda_error == 35 || s.cuda_error == 100;
    EXPECT_EQ(s.reason.rfind(ordinary ? "no GPU: " : "CUDA is broken here: ", 0), 0u) << s.reason;
  }
  // The environment CTest set up may say which answer it must be (the stub as libcuda.so.1: 34).
  if (const char* want = std::getenv("UBEP_TEST_EXPECT_CUDA_ERROR"))
    EXPECT_EQ(s.cuda_error, std::atoi(want)) << s.reason;
  // Empty CUDA_VISIBLE_DEVICES hides every device on any machine.
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible && *visible == '\0') EXPECT_FALSE(s.available) << s.reason;
  EXPECT_EQ(ubep::detail::gpu::pci_bus_ids().size(), static_cast<std::size_t>(s.devices));
}

TEST(Gpu, OneAnswerForEveryCallAndThread) {
  const ubep::GpuStatus* first = &ubep::gpu_status();
  std::vector<const ubep::GpuStatus*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (auto& p : seen) threads.emplace_back([&p] { p = &ubep::gpu_status(); });
  for (auto& t : threads) t.join();
  for (const auto* p : seen) EXPECT_EQ(p, first);
}

#if UBEP_HAVE_CUDA
// The driver table: every entry resolved where there is a GPU; without one, a clear error with CUDA's answer,
// as often as it is asked.
TEST(Gpu, DriverEntryPointsResolveOrSayWhyNot) {
  const ubep::GpuStatus& s = ubep::gpu_status();
  if (s.available) {
    const ubep::detail::gpu::Driver& d = ubep::detail::gpu::driver();
    EXPECT_NE(d.get_error_name, nullptr);
    EXPECT_NE(d.stream_write_value64, nullptr);
    EXPECT_NE(d.stream_wait_value64, nullptr);
    EXPECT_NE(d.mem_create, nullptr);
    EXPECT_NE(d.mem_export_to_shareable_handle, nullptr);
    EXPECT_NE(d.mem_import_from_shareable_handle, nullptr);
    return;
  }
  for (int i = 0; i < 2; ++i) {
    try {
      (void)ubep::detail::gpu::driver();
      ADD_FAILURE() << "driver() returned without a GPU";
    } catch (const ubep::Error& e) {
      EXPECT_EQ(e.code(), ubep::Errc::unsupported);
      EXPECT_NE(std::string(e.what()).find(s.reason), std::string::npos) << e.what();
    }
  }
}
#endif

}  // namespace
