/// \file gpu.hpp
/// Whether this process has a GPU. libubep built with CUDA links the CUDA runtime statically and never
/// links the driver (libcuda): a host-only job runs unchanged on a machine without a driver, and CUDA is
/// initialized only when something asks for a GPU (this call, a Context under UBEP_GPU=1).
#pragma once

#include <string>

namespace ubep {

/// What this process found when it asked CUDA for devices.
struct GpuStatus {
  bool built = false;      ///< libubep was built with CUDA (UBEP_HAVE_CUDA)
  bool available = false;  ///< at least one device answered; CUDA is initialized
  int devices = 0;         ///< cudaGetDeviceCount's count when available, else 0
  /// cudaGetDeviceCount's cudaError_t when not available (0 when available or not built). 35 (no driver),
  /// 34 (the driver's link stub found instead of a driver) and 100 (no device, e.g. CUDA_VISIBLE_DEVICES
  /// empty) are the ordinary "no GPU" answers; any other code is a broken CUDA installation.
  int cuda_error = 0;
  /// One line for people: "2 devices (CUDA driver 13.0)", "no GPU: cudaGetDeviceCount returned 35
  /// (cudaErrorInsufficientDriver: ...)", "built without CUDA".
  std::string reason;
};

/// Asks CUDA once, on the first call from any thread (thread-safe; needs no MPI), and returns the same
/// answer on every later call. Before the first call libubep has not touched CUDA.
const GpuStatus& gpu_status();

}  // namespace ubep
