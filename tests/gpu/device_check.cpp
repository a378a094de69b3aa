// gpu.device_check (label gpu): on a machine with an NVIDIA GPU, CUDA answers through ubep::gpu_status(), every
// driver entry point ubep uses resolves (base/gpu_driver.hpp), and each device has a PCI bus id. Without a GPU
// it exits 77 (CTest: skipped) with one line saying why; UBEP_REQUIRE_GPU=1 makes that a failure.
#include <cstdio>
#include <exception>

#include "base/gpu.hpp"
#include "base/gpu_driver.hpp"
#include "tests/gpu/require_gpu.hpp"
#include "ubep/config.hpp"
#include "ubep/gpu.hpp"

int main() {
  if (const auto code = ubep::test::exit_without_gpu()) return *code;
  const ubep::GpuStatus& s = ubep::gpu_status();
  int failures = 0;
  const auto check = [&](bool ok, const char* what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
    failures += ok ? 0 : 1;
  };
  check(s.devices > 0 && s.cuda_error == 0, "gpu_status(): devices, no error");
  check(ubep::detail::gpu::pci_bus_ids().size() == static_cast<std::size_t>(s.devices), "a PCI bus id per device");
#if UBEP_HAVE_CUDA
  try {
    const ubep::detail::gpu::Driver& d = ubep::detail::gpu::driver();
    check(d.stream_write_value64 && d.stream_wait_value64, "cuStreamWriteValue64, cuStreamWaitValue64");
    check(d.mem_create && d.mem_map && d.mem_set_access && d.mem_export_to_shareable_handle &&
              d.mem_import_from_shareable_handle,
          "cuMemCreate, cuMemMap, cuMemSetAccess, cuMemExport/ImportShareableHandle");
  } catch (const std::exception& e) {
    check(false, e.what());
  }
#endif
  return failures ? 1 : 0;
}
