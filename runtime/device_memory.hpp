// The symmetric GPU heap of a Context (private to the runtime layer; runtime/device.cpp fills it at the first
// Context::alloc_device).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/heap.hpp"
#include "transports/device_heap.hpp"

namespace ubep::detail {

struct StagedRoute;  // runtime/staged_route.hpp
class MpiRmaTransport;

struct DeviceMemory {
  DeviceMemory();
  ~DeviceMemory();                      // runtime/device.cpp, where StagedRoute is complete
  std::unique_ptr<DeviceHeap> heap;     // this rank's heap and the node peers' mappings (CUDA or emulated)
  HeapAllocator alloc;                  // the objects in it, as the host heap's
  std::vector<char*> peer;              // per world rank: its GPU heap as mapped here; null off this node
  std::unique_ptr<StagedRoute> staged;  // the staged route to other nodes; null when the job is on one node
  // Or, for UBEP_GPU_MPI_WINDOW (a CUDA-aware MPI, or forced): an MPI window over the GPU heap, passive target
  // (MPI_Win_lock_all for its life), and the mpi transport on it; null/MPI_WIN_NULL otherwise.
  MPI_Win window = MPI_WIN_NULL;
  std::unique_ptr<MpiRmaTransport> window_route;
  std::string window_why;  // why the window carries the data ("MPIX_Query_cuda_support() = 1 on every rank", ...)
  /// Frees the window (collective over the Context's communicator: finalize's teardown, every rank alike).
  void close_window() noexcept;
};

}  // namespace ubep::detail
