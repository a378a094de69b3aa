// base/gpu_driver.hpp: the CUDA driver functions ubep calls, for the layers that move GPU memory (CUDA builds
// only). They are resolved at run time through the CUDA runtime's cudaGetDriverEntryPointByVersion, in
// base/gpu.cpp and nowhere else: libubep never links libcuda, whose absence would kill every binary at start
// on a machine without a driver.
#pragma once

#include "ubep/config.hpp"

#if UBEP_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>

namespace ubep::detail::gpu {

/// The driver functions ubep calls, one line each: X(member, symbol, version), the member being the symbol's
/// ABI as of that CUDA version (its PFN_<symbol>_v<version> type; the version asked for at run time).
#define UBEP_GPU_DRIVER_FUNCTIONS(X)                                      \
  X(get_error_name, cuGetErrorName, 6000)                                 \
  X(device_get, cuDeviceGet, 2000)                                        \
  X(device_get_attribute, cuDeviceGetAttribute, 2000)                     \
  X(stream_write_value64, cuStreamWriteValue64, 11070)                    \
  X(stream_wait_value64, cuStreamWaitValue64, 11070)                      \
  X(mem_create, cuMemCreate, 10020)                                       \
  X(mem_release, cuMemRelease, 10020)                                     \
  X(mem_address_reserve, cuMemAddressReserve, 10020)                      \
  X(mem_address_free, cuMemAddressFree, 10020)                            \
  X(mem_map, cuMemMap, 10020)                                             \
  X(mem_unmap, cuMemUnmap, 10020)                                         \
  X(mem_set_access, cuMemSetAccess, 10020)                                \
  X(mem_get_allocation_granularity, cuMemGetAllocationGranularity, 10020) \
  X(mem_export_to_shareable_handle, cuMemExportToShareableHandle, 10020)  \
  X(mem_import_from_shareable_handle, cuMemImportFromShareableHandle, 10020)

struct Driver {
#define UBEP_GPU_DRIVER_MEMBER(member, symbol, version) PFN_##symbol##_v##version member = nullptr;
  UBEP_GPU_DRIVER_FUNCTIONS(UBEP_GPU_DRIVER_MEMBER)
#undef UBEP_GPU_DRIVER_MEMBER
};

/// The driver table, resolved on the first call (after gpu_status(), which it calls). Throws ubep::Error
/// (unsupported) when there is no GPU, with gpu_status()'s reason, or when the driver lacks a symbol, naming
/// it and the version asked for.
const Driver& driver();

}  // namespace ubep::detail::gpu
#endif
