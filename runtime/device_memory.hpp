// The symmetric GPU heap of a Context (private to the runtime layer; runtime/device.cpp fills it at the first
// Context::alloc_device). Here so that State can own one without knowing CUDA.
#pragma once

#include <memory>
#include <vector>

#include "runtime/heap.hpp"

namespace ubep::detail {

namespace cuda {
class DeviceHeap;  // transports/cuda/device_heap.hpp (CUDA builds)
}

struct DeviceMemory {
  DeviceMemory();
  ~DeviceMemory();  // runtime/device.cpp, where DeviceHeap is complete
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  std::unique_ptr<cuda::DeviceHeap> heap;  // this rank's heap and the node peers' mappings
  HeapAllocator alloc;                     // the objects in it, as the host heap's
  std::vector<char*> peer;                 // per world rank: its GPU heap as mapped here; null off this node
};

}  // namespace ubep::detail
