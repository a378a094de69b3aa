#include "transports/device_heap.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "base/gpu_driver.hpp"
#include "transports/node_fds.hpp"
#include "ubep/error.hpp"

namespace ubep::detail::cuda {
namespace {

void check_runtime(cudaError_t rc, const std::string& where, const std::string& what) {
  if (rc == cudaSuccess) return;
  cudaGetLastError();  // not sticky for the next call of this thread
  throw Error(Errc::cuda, where + what + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")",
              static_cast<int>(rc));
}

void check_driver(CUresult rc, const std::string& where, const std::string& what) {
  if (rc == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (gpu::driver().get_error_name(rc, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  throw Error(Errc::cuda, where + what + " failed: " + name + " (" + std::to_string(static_cast<int>(rc)) + ")",
              static_cast<int>(rc));
}

CUmemAllocationProp allocation_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

class CudaHeap final : public DeviceHeap {
 public:
  CudaHeap(std::size_t bytes, int device, Ipc ipc, const std::string& where);
  ~CudaHeap() override { release(); }
  void map_node(MPI_Comm node_comm, int world_rank, const char* call, std::chrono::duration<double> timeout,
                const std::function<void(MPI_Request&)>& wait, const std::string& where) override;
  void copy_async(void* dst, const void* src, std::size_t bytes, const std::string& where) override;
  void synchronize(const std::string& where) override;
  std::string describe() const override;

 private:
  struct Mapping {  // one imported fd-heap: its handle and reservation
    CUmemGenericAllocationHandle handle = 0;
    char* ptr = nullptr;
  };
  void release() noexcept;
  char* map_handle(CUmemGenericAllocationHandle handle, const std::string& where, const std::string& what);

  int device_ = 0;
  Ipc ipc_ = Ipc::legacy;
  std::size_t granularity_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;  // fd: this rank's allocation
  cudaStream_t stream_ = nullptr;
  std::vector<Mapping> imported_;     // fd: the peers' handles and reservations
  std::vector<char*> legacy_opened_;  // legacy: pointers from cudaIpcOpenMemHandle
};

}  // namespace

const char* to_string(Ipc ipc) noexcept {
  return ipc == Ipc::fd ? "cuMemCreate + POSIX fd over a Unix socket" : "cudaIpcGetMemHandle over MPI";
}

DeviceChoice choose_device(const std::string& where) {
  DeviceChoice c;
  check_runtime(cudaGetDevice(&c.device), where, "cudaGetDevice");
  const gpu::Driver& d = gpu::driver();
  CUdevice dev = 0;
  check_driver(d.device_get(&dev, c.device), where, "cuDeviceGet(" + std::to_string(c.device) + ")");
  int vmm = 0, fd = 0;
  check_driver(d.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev), where,
               "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
  check_driver(d.device_get_attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev), where,
               "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)");
  c.ipc = vmm && fd ? Ipc::fd : Ipc::legacy;
  return c;
}

CudaHeap::CudaHeap(std::size_t bytes, int device, Ipc ipc, const std::string& where) : device_(device), ipc_(ipc) {
  const std::string on = " on device " + std::to_string(device);
  try {
    check_runtime(cudaSetDevice(device), where, "cudaSetDevice(" + std::to_string(device) + ")");
    check_runtime(cudaFree(nullptr), where, "initializing the primary context" + on);  // cuMem* need it current
    if (ipc == Ipc::fd) {
      const gpu::Driver& d = gpu::driver();
      const CUmemAllocationProp prop = allocation_prop(device);
      std::size_t g = 0;
      check_driver(d.mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), where,
                   "cuMemGetAllocationGranularity" + on);
      granularity_ = g ? g : (std::size_t{2} << 20);
      size_ = (bytes + granularity_ - 1) / granularity_ * granularity_;
      CUmemGenericAllocationHandle h = 0;
      check_driver(d.mem_create(&h, size_, &prop, 0), where,
                   "cuMemCreate of " + std::to_string(size_) + " bytes (UBEP_GPU_HEAP_SIZE)" + on);
      handle_ = h;
      base_ = map_handle(h, where, "this rank's heap");
    } else {
      size_ = (bytes + 4095) / 4096 * 4096;
      void* p = nullptr;
      check_runtime(cudaMalloc(&p, size_), where,
                    "cudaMalloc of " + std::to_string(size_) + " bytes (UBEP_GPU_HEAP_SIZE)" + on);
      base_ = static_cast<char*>(p);
    }
    check_runtime(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where, "cudaStreamCreateWithFlags" + on);
  } catch (...) {
    release();
    throw;
  }
}

char* CudaHeap::map_handle(CUmemGenericAllocationHandle handle, const std::string& where, const std::string& what) {
  const gpu::Driver& d = gpu::driver();
  CUdeviceptr ptr = 0;
  const std::string of = " of " + what + " (" + std::to_string(size_) + " bytes)";
  check_driver(d.mem_address_reserve(&ptr, size_, granularity_, 0, 0), where, "cuMemAddressReserve" + of);
  if (const CUresult rc = d.mem_map(ptr, size_, 0, handle, 0); rc != CUDA_SUCCESS) {
    d.mem_address_free(ptr, size_);
    check_driver(rc, where, "cuMemMap" + of);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (const CUresult rc = d.mem_set_access(ptr, size_, &access, 1); rc != CUDA_SUCCESS) {
    d.mem_unmap(ptr, size_);
    d.mem_address_free(ptr, size_);
    check_driver(rc, where,
                 "cuMemSetAccess" + of + " for device " + std::to_string(device_) +
                     " (a heap on another GPU needs peer access between the two)");
  }
  return reinterpret_cast<char*>(static_cast<std::uintptr_t>(ptr));
}

void CudaHeap::map_node(MPI_Comm node_comm, int world_rank, const char* call, std::chrono::duration<double> timeout,
                        const std::function<void(MPI_Request&)>& wait, const std::string& where) {
  int me = 0, n = 1;
  MPI_Comm_rank(node_comm, &me);
  MPI_Comm_size(node_comm, &n);
  peers_.assign(n, nullptr);
  peers_[me] = base_;
  if (ipc_ == Ipc::fd) {
    const gpu::Driver& d = gpu::driver();
    int fd = -1;
    check_driver(d.mem_export_to_shareable_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), where,
                 "cuMemExportToShareableHandle (POSIX fd)");
    std::vector<int> fds;
    try {
      fds = exchange_node_fds(node_comm, fd, world_rank, call, timeout);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    struct Closer {  // every received fd, also when an import throws
      std::vector<int>& fds;
      ~Closer() {
        for (int f : fds) {
          if (f >= 0) ::close(f);
        }
      }
    } closer{fds};
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      CUmemGenericAllocationHandle h = 0;
      const std::string peer = "node rank " + std::to_string(r) + "'s heap";
      check_driver(d.mem_import_from_shareable_handle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[r])),
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   where, "cuMemImportFromShareableHandle of " + peer);
      char* p = nullptr;
      try {
        p = map_handle(h, where, peer);
      } catch (...) {
        d.mem_release(h);
        throw;
      }
      imported_.push_back({h, p});
      peers_[r] = p;
    }
    return;
  }
  // legacy: 64-byte handles gathered over the node, opened by everyone else (CUDA refuses one's own).
  cudaIpcMemHandle_t mine{};
  check_runtime(cudaIpcGetMemHandle(&mine, base_), where, "cudaIpcGetMemHandle");
  // On the heap and kept on a timeout: MPI may still write into it.
  auto all = std::make_unique<std::vector<cudaIpcMemHandle_t>>(n);
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all->data(), sizeof mine, MPI_BYTE, node_comm, &req);
  if (rc != MPI_SUCCESS) throw_mpi_error(rc, world_rank, call, "MPI_Iallgather (CUDA IPC handles)");
  try {
    wait(req);
  } catch (...) {
    (void)all.release();  // the gather may still complete into it
    throw;
  }
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    void* p = nullptr;
    check_runtime(cudaIpcOpenMemHandle(&p, (*all)[r], cudaIpcMemLazyEnablePeerAccess), where,
                  "cudaIpcOpenMemHandle of node rank " + std::to_string(r) + "'s heap");
    legacy_opened_.push_back(static_cast<char*>(p));
    peers_[r] = static_cast<char*>(p);
  }
}

namespace {

/// The heap's device made current for one call and the caller's restored after it: the application may have
/// switched devices since the heap was created (cudaSetDevice is per thread).
class OnDevice {
 public:
  OnDevice(int device, const std::string& where) {
    check_runtime(cudaGetDevice(&previous_), where, "cudaGetDevice");
    if (previous_ != device)
      check_runtime(cudaSetDevice(device), where, "cudaSetDevice(" + std::to_string(device) + ")");
    switched_ = previous_ != device;
  }
  ~OnDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

void CudaHeap::copy_async(void* dst, const void* src, std::size_t bytes, const std::string& where) {
  const OnDevice on(device_, where);
  check_runtime(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), where,
                "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
}

void CudaHeap::synchronize(const std::string& where) {
  const OnDevice on(device_, where);
  check_runtime(cudaStreamSynchronize(stream_), where,
                "cudaStreamSynchronize (the copies into and out of the GPU heaps)");
}

void CudaHeap::release() noexcept {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  for (char* p : legacy_opened_) cudaIpcCloseMemHandle(p);
  legacy_opened_.clear();
  if (ipc_ == Ipc::fd && (handle_ || !imported_.empty())) {
    const gpu::Driver& d = gpu::driver();  // resolved: a handle exists only after it was
    for (const Mapping& m : imported_) {
      const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(m.ptr));
      d.mem_unmap(ptr, size_);
      d.mem_address_free(ptr, size_);
      d.mem_release(m.handle);
    }
    imported_.clear();
    if (base_) {
      const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(base_));
      d.mem_unmap(ptr, size_);
      d.mem_address_free(ptr, size_);
    }
    if (handle_) d.mem_release(handle_);
    handle_ = 0;
  } else if (base_) {
    cudaFree(base_);
  }
  base_ = nullptr;
  peers_.clear();
  cudaGetLastError();
}

std::string CudaHeap::describe() const {
  return std::to_string(size_) + " bytes on CUDA device " + std::to_string(device_) + ", shared with the node by " +
         to_string(ipc_);
}

std::unique_ptr<DeviceHeap> make_device_heap(std::size_t bytes, int device, Ipc ipc, const std::string& where) {
  return std::make_unique<CudaHeap>(bytes, device, ipc, where);
}

}  // namespace ubep::detail::cuda
