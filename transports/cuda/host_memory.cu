// The CUDA runtime calls of transports/cuda/host_memory.hpp.
#include <cuda_runtime_api.h>

#include "transports/cuda/host_memory.hpp"

namespace ubep::detail::cuda {

int register_host(void* ptr, std::size_t bytes, void** device, bool* registered_here) {
  cudaError_t rc = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  *registered_here = rc == cudaSuccess;
  if (rc == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();  // not sticky, but cleared so that a later launch check does not see it
    rc = cudaSuccess;
  }
  if (rc == cudaSuccess) rc = cudaHostGetDevicePointer(device, ptr, 0);
  return static_cast<int>(rc);
}

int unregister_host(void* ptr) { return static_cast<int>(cudaHostUnregister(ptr)); }

int alloc_mapped(std::size_t bytes, void** host, void** device) {
  cudaError_t rc = cudaHostAlloc(host, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (rc == cudaSuccess) rc = cudaHostGetDevicePointer(device, *host, 0);
  return static_cast<int>(rc);
}

int free_mapped(void* host) { return static_cast<int>(cudaFreeHost(host)); }

int copy_async(void* stream, void* dst, const void* src, std::size_t bytes) {
  return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

int host_func_async(void* stream, void (*fn)(void*), void* arg) {
  return static_cast<int>(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, arg));
}

}  // namespace ubep::detail::cuda
