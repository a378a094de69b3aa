// base/gpu.hpp: the lazy CUDA initialization behind ubep::gpu_status() (include/ubep/gpu.hpp), for the layers
// that must know whether CUDA is up without bringing it up (topology's GPU locality).
#pragma once

#include <string>
#include <vector>

namespace ubep::detail::gpu {

/// True once gpu_status() has run in this process (CUDA was asked); never initializes anything.
bool asked() noexcept;

/// The PCI bus id ("0000:3b:00.0") of every CUDA device, in CUDA's device order. Calls gpu_status(); empty
/// when it says no GPU, or when an id cannot be read.
std::vector<std::string> pci_bus_ids();

}  // namespace ubep::detail::gpu
