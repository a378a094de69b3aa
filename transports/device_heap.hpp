// transports/device_heap.hpp: one rank's symmetric GPU heap and its node peers' heaps mapped into this process
// (issue 15), with the copies that move bytes between them. Two implementations behind one interface:
//  - CUDA (transports/cuda/device_heap.cpp, CUDA builds): device memory on the current CUDA device, shared with
//    the node in one of two ways, chosen per node:
//     - fd: cuMemCreate with POSIX file-descriptor handles, exported with cuMemExportToShareableHandle and sent
//       to the node peers over a Unix socket (transports/node_fds.hpp, SCM_RIGHTS), imported and mapped;
//     - legacy: cudaMalloc, with cudaIpcGetMemHandle handles gathered over the node communicator and opened
//       with cudaIpcOpenMemHandle (where the device lacks virtual memory management or fd handles);
//    copies are cudaMemcpyAsync on one non-blocking stream;
//  - emulated (transports/emulated_device_heap.cpp, every build; UBEP_GPU_EMULATE=1, for testing): host memory
//    standing in for the GPU, a memfd per rank sent to the node peers the same way as the fd handles and mapped
//    there, copies memcpy. It runs every line of the runtime's GPU-heap code on machines without a GPU.
// The mapping is of the whole heap, once; the runtime hands out objects in it with its own allocator.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ubep::detail {

class DeviceHeap {
 public:
  virtual ~DeviceHeap() = default;
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  /// Collective over `node_comm` (every rank with a heap of the same kind and size): maps every node rank's
  /// heap here. `wait` completes an MPI request with the caller's deadline; `timeout` bounds the fd exchange.
  /// Throws ubep::Error naming `where` ("ubep: rank R: call: "); the peers mapped before a throw stay mapped
  /// until the destructor.
  virtual void map_node(MPI_Comm node_comm, int world_rank, const char* call, std::chrono::duration<double> timeout,
                        const std::function<void(MPI_Request&)>& wait, const std::string& where) = 0;
  /// Copies `bytes` from `src` to `dst`, asynchronously: either end in a mapped heap or in host memory
  /// (pageable sources are copied out before the call returns, pageable destinations filled before it
  /// returns, as CUDA does). Throws Error(Errc::cuda).
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, const std::string& where) = 0;
  /// Waits for every copy issued so far. Throws Error(Errc::cuda).
  virtual void synchronize(const std::string& where) = 0;
  /// One line for ubep-info: size, device, how the node shares it.
  virtual std::string describe() const = 0;

  char* base() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  /// Node rank `r`'s heap as mapped in this process (this rank's own: base()); null before map_node().
  char* peer(int r) const noexcept {
    return r >= 0 && static_cast<std::size_t>(r) < peers_.size() ? peers_[r] : nullptr;
  }

 protected:
  DeviceHeap() = default;
  char* base_ = nullptr;
  std::size_t size_ = 0;
  std::vector<char*> peers_;
};

/// The emulated heap: `bytes` (rounded up to 2 MiB, as a GPU's allocation granularity) of shared host memory.
/// Throws Error(Errc::internal) naming `where` when the system refuses (memfd_create, ftruncate, mmap).
std::unique_ptr<DeviceHeap> make_emulated_device_heap(std::size_t bytes, const std::string& where);

namespace cuda {

/// How a CUDA heap is shared. Ordered: a node uses the least of what its ranks support.
enum class Ipc : int { legacy = 1, fd = 2 };
const char* to_string(Ipc ipc) noexcept;

/// The current CUDA device of this thread (cudaGetDevice) and the best Ipc it supports. Initializes CUDA.
/// Throws Error(Errc::cuda) naming `where` when CUDA fails.
struct DeviceChoice {
  int device = 0;
  Ipc ipc = Ipc::legacy;
};
DeviceChoice choose_device(const std::string& where);

/// `bytes` (rounded up to the allocation granularity) on `device`, allocated so that `ipc` can share it, plus
/// a non-blocking copy stream. Throws Error(Errc::cuda) naming `where` and the failed call; nothing is left
/// allocated then. CUDA builds only.
std::unique_ptr<DeviceHeap> make_device_heap(std::size_t bytes, int device, Ipc ipc, const std::string& where);

}  // namespace cuda
}  // namespace ubep::detail
