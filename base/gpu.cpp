#include "ubep/gpu.hpp"

#include <atomic>
#include <string>

#include "base/gpu.hpp"
#include "base/gpu_driver.hpp"
#include "ubep/config.hpp"
#include "ubep/error.hpp"

#if UBEP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ubep {
namespace {

std::atomic<bool> g_asked{false};

GpuStatus probe() {
  GpuStatus s;
#if UBEP_HAVE_CUDA
  s.built = true;
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaSuccess && count > 0) {
    s.available = true;
    s.devices = count;
    int driver = 0;
    cudaDriverGetVersion(&driver);
    s.reason = std::to_string(count) + (count == 1 ? " device" : " devices") + " (CUDA driver " +
               std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) + ")";
    return s;
  }
  // 35 no driver, 34 the link stub instead of a driver, 100 no device: what a machine without a GPU says.
  s.cuda_error = rc == cudaSuccess ? static_cast<int>(cudaErrorNoDevice) : static_cast<int>(rc);
  const auto code = static_cast<cudaError_t>(s.cuda_error);
  const bool ordinary =
      code == cudaErrorInsufficientDriver || code == cudaErrorStubLibrary || code == cudaErrorNoDevice;
  s.reason = std::string(ordinary ? "no GPU" : "CUDA is broken here") + ": cudaGetDeviceCount returned " +
             std::to_string(s.cuda_error) + " (" + cudaGetErrorName(code) + ": " + cudaGetErrorString(code) + ")";
  cudaGetLastError();  // the error is sticky for the next runtime call of this thread; clear it
#else
  s.reason = "built without CUDA";
#endif
  return s;
}

}  // namespace

const GpuStatus& gpu_status() {
  static const GpuStatus status = [] {
    g_asked.store(true, std::memory_order_release);
    return probe();
  }();
  return status;
}

namespace detail::gpu {

bool asked() noexcept { return g_asked.load(std::memory_order_acquire); }

std::vector<std::string> pci_bus_ids() {
  std::vector<std::string> ids;
#if UBEP_HAVE_CUDA
  const GpuStatus& s = gpu_status();
  for (int d = 0; d < s.devices; ++d) {
    char busid[32] = {};
    if (cudaDeviceGetPCIBusId(busid, sizeof busid, d) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    ids.emplace_back(busid);
  }
#endif
  return ids;
}

#if UBEP_HAVE_CUDA
namespace {

template <class Fn>
void resolve(Fn& fn, const char* symbol, unsigned version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t rc = cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &found);
  if (rc != cudaSuccess || found != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError();
    throw Error(Errc::unsupported, std::string("ubep: GPU: the CUDA driver has no ") + symbol + " (version " +
                                       std::to_string(version) + "): cudaGetDriverEntryPointByVersion returned " +
                                       std::to_string(static_cast<int>(rc)) + ", query result " +
                                       std::to_string(static_cast<int>(found)));
  }
  fn = reinterpret_cast<Fn>(p);
}

Driver load() {
  const GpuStatus& s = gpu_status();
  if (!s.available) throw Error(Errc::unsupported, "ubep: GPU: the CUDA driver is not usable: " + s.reason);
  Driver d;
#define UBEP_GPU_DRIVER_RESOLVE(member, symbol, version) resolve(d.member, #symbol, version);
  UBEP_GPU_DRIVER_FUNCTIONS(UBEP_GPU_DRIVER_RESOLVE)
#undef UBEP_GPU_DRIVER_RESOLVE
  return d;
}

}  // namespace

const Driver& driver() {
  static const Driver d = load();  // a throw leaves it unset: the next call tries again and throws again
  return d;
}
#endif

}  // namespace detail::gpu
}  // namespace ubep
