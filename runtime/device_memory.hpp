// The symmetric GPU heap of a Context (private to the runtime layer; runtime/device.cpp fills it at the first
// Context::alloc_device).
#pragma once

#include <memory>
#include <vector>

#include "runtime/heap.hpp"
#include "transports/device_heap.hpp"

namespace ubep::detail {

struct StagedRoute;  // runtime/device.cpp

struct DeviceMemory {
  DeviceMemory();
  ~DeviceMemory();                      // runtime/device.cpp, where StagedRoute is complete
  std::unique_ptr<DeviceHeap> heap;     // this rank's heap and the node peers' mappings (CUDA or emulated)
  HeapAllocator alloc;                  // the objects in it, as the host heap's
  std::vector<char*> peer;              // per world rank: its GPU heap as mapped here; null off this node
  std::unique_ptr<StagedRoute> staged;  // the staged route to other nodes; null when the job is on one node
};

}  // namespace ubep::detail
