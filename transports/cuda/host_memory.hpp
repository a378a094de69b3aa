// transports/cuda/host_memory.hpp: the CUDA runtime calls the stream-ordered signals need besides the kernels
// (host memory the GPU reaches, copies and host callbacks in stream order). No CUDA types: streams pass as
// void* (a cudaStream_t), results as the cudaError_t in an int (0 = cudaSuccess; error_string() of
// signal_kernels.hpp names it). Compiled by nvcc with the kernels (UBEP_HAVE_CUDA_KERNELS builds only).
#pragma once

#include <cstddef>

namespace ubep::detail::cuda {

/// Page-locks [ptr, ptr + bytes) for every device (cudaHostRegister, portable + mapped) and returns in
/// `*device` the address the GPU uses for `ptr`. Memory the process registered before (the application, a
/// CUDA-aware MPI) is used as it is: `*registered_here` is then false, and it must not be unregistered.
int register_host(void* ptr, std::size_t bytes, void** device, bool* registered_here);
/// Undoes register_host.
int unregister_host(void* ptr);
/// `bytes` of pinned host memory mapped for every device (cudaHostAlloc, portable + mapped): the host
/// address in `*host`, the device's in `*device`.
int alloc_mapped(std::size_t bytes, void** host, void** device);
int free_mapped(void* host);
/// cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream).
int copy_async(void* stream, void* dst, const void* src, std::size_t bytes);
/// cudaLaunchHostFunc(stream, fn, arg): fn(arg) runs on a CUDA thread once the stream's earlier work is
/// complete; fn must not call CUDA.
int host_func_async(void* stream, void (*fn)(void*), void* arg);

}  // namespace ubep::detail::cuda
