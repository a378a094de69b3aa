// The symmetric GPU heap of a Context (private to the runtime layer; runtime/device.cpp fills it at the first
// Context::alloc_device).
#pragma once

#include <memory>
#include <vector>

#include "runtime/heap.hpp"
#include "transports/device_heap.hpp"

namespace ubep::detail {

struct DeviceMemory {
  std::unique_ptr<DeviceHeap> heap;  // this rank's heap and the node peers' mappings (CUDA or emulated)
  HeapAllocator alloc;               // the objects in it, as the host heap's
  std::vector<char*> peer;           // per world rank: its GPU heap as mapped here; null off this node
};

}  // namespace ubep::detail
