// transports/cuda/device_heap.hpp: one rank's symmetric GPU heap and the node peers' heaps mapped into this
// process (issue 15), with the copy stream that moves bytes between them. CUDA builds only (UBEP_HAVE_CUDA);
// plain C++ over the CUDA runtime and the driver table of base/gpu_driver.hpp (no kernels, no nvcc).
//
// Two ways to share a heap with the processes of a node, chosen per job:
//  - fd: cuMemCreate with POSIX file-descriptor handles, exported with cuMemExportToShareableHandle and sent
//    to the node peers over a Unix socket (transports/node_fds.hpp, SCM_RIGHTS), imported and mapped by each;
//  - legacy: cudaMalloc, with cudaIpcGetMemHandle handles gathered over the node communicator and opened with
//    cudaIpcOpenMemHandle (where the device has no virtual memory management or fd handles).
// The mapping is of the whole heap, once; the runtime hands out objects in it with its own allocator.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace ubep::detail::cuda {

/// How a heap is shared. Ordered: a node uses the least of what its ranks support.
enum class Ipc : int { legacy = 1, fd = 2 };
const char* to_string(Ipc ipc) noexcept;

/// The current CUDA device of this thread (cudaGetDevice) and the best Ipc it supports. Initializes CUDA.
/// Throws Error(Errc::cuda) naming `where` when CUDA fails.
struct DeviceChoice {
  int device = 0;
  Ipc ipc = Ipc::legacy;
};
DeviceChoice choose_device(const std::string& where);

class DeviceHeap {
 public:
  /// Local: `bytes` (rounded up to the allocation granularity) on `device`, allocated so that `ipc` can share
  /// it, plus a non-blocking copy stream. Throws Error(Errc::cuda) naming `where` ("ubep: rank R: call: ") and
  /// the failed call; nothing is left allocated then.
  DeviceHeap(std::size_t bytes, int device, Ipc ipc, const std::string& where);
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  /// Collective over `node_comm` (every rank with a DeviceHeap of the same size and Ipc): maps every node
  /// rank's heap here. `wait` completes an MPI request with the caller's deadline (legacy handles are gathered
  /// with MPI_Iallgather); `timeout` bounds the fd exchange. Throws ubep::Error naming `where`; the peers
  /// mapped before a throw stay mapped until the destructor.
  void map_node(MPI_Comm node_comm, int world_rank, const char* call, std::chrono::duration<double> timeout,
                const std::function<void(MPI_Request&)>& wait, const std::string& where);

  char* base() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  Ipc ipc() const noexcept { return ipc_; }
  /// Node rank `r`'s heap as mapped in this process (this rank's own: base()); null before map_node().
  char* peer(int r) const noexcept {
    return r >= 0 && static_cast<std::size_t>(r) < peers_.size() ? peers_[r] : nullptr;
  }

  /// cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault) on the copy stream: either end device memory of
  /// any mapped heap, or host memory (pageable sources are copied out before the call returns, pageable
  /// destinations filled before it returns, as CUDA does). Throws Error(Errc::cuda).
  void copy_async(void* dst, const void* src, std::size_t bytes, const std::string& where);
  /// Waits for every copy issued so far (cudaStreamSynchronize). Throws Error(Errc::cuda).
  void synchronize(const std::string& where);

 private:
  struct Mapping {  // one imported fd-heap: its handle and reservation
    unsigned long long handle = 0;
    char* ptr = nullptr;
  };
  void release() noexcept;
  char* map_handle(unsigned long long handle, const std::string& where, const char* what);

  int device_ = 0;
  Ipc ipc_ = Ipc::legacy;
  std::size_t size_ = 0, granularity_ = 0;
  unsigned long long handle_ = 0;  // fd: this rank's CUmemGenericAllocationHandle
  char* base_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t
  std::vector<char*> peers_;
  std::vector<Mapping> imported_;     // fd: the peers' handles and reservations
  std::vector<char*> legacy_opened_;  // legacy: pointers from cudaIpcOpenMemHandle
};

}  // namespace ubep::detail::cuda
