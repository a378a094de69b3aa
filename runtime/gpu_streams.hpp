// The state of a Context's stream-ordered calls (runtime/stream.cpp, include/ubep/stream.hpp): the node's
// host heaps registered with CUDA, and the mapped host memory that stream waits write their outcome into.
// Created by the first stream call of a context; destroyed (registrations undone, memory freed) before the
// heap's windows are freed, or with the State.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "transports/cuda/signal_kernels.hpp"

namespace ubep::detail {

/// One stream wait's outcome: where the host reads it, and where the GPU writes it.
struct StreamWaitSlot {
  cuda::StreamWaitStatus* host = nullptr;
  cuda::StreamWaitStatus* device = nullptr;
};

/// A host address range [begin, end) and the peers whose heaps it holds.
struct HostRange {
  std::uintptr_t begin = 0, end = 0;
  std::vector<int> pes;
};

/// The ranges sorted by address and merged wherever two share or touch a page of `page` bytes (CUDA refuses
/// two registrations of one page): what the first stream call registers, one cudaHostRegister per range.
/// Ranges further apart stay apart (the gap between them may not be mapped).
std::vector<HostRange> merge_host_ranges(std::vector<HostRange> ranges, std::uintptr_t page);

struct GpuStreams {
  /// Per peer: the device address of its mapped heap (route self or shm), else null.
  std::vector<char*> device_heap;
  /// The host ranges registered with CUDA (merged where pages touch), undone by the destructor.
  std::vector<void*> registered;
  /// Blocks of slots (cudaHostAlloc'd), and the slots not in use.
  std::vector<void*> blocks;
  std::deque<StreamWaitSlot> slots;
  std::vector<StreamWaitSlot*> free_slots;

  GpuStreams() = default;
  GpuStreams(const GpuStreams&) = delete;
  GpuStreams& operator=(const GpuStreams&) = delete;
  ~GpuStreams();  // never throws: CUDA's answers are ignored (the process may be tearing down)
};

}  // namespace ubep::detail
