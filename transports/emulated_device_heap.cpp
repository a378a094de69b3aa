// The emulated GPU heap (UBEP_GPU_EMULATE=1, testing): shared host memory standing in for device memory, with
// the node exchange of the CUDA fd path (a memfd per rank, sent over the node socket and mapped by each peer)
// and copies that are memcpy. See transports/device_heap.hpp.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "transports/device_heap.hpp"
#include "transports/node_fds.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {
namespace {

/// The allocation granularity of current GPUs, so that sizes round as on a device.
constexpr std::size_t kGranularity = std::size_t{2} << 20;

class EmulatedHeap final : public DeviceHeap {
 public:
  EmulatedHeap(std::size_t bytes, const std::string& where) {
    size_ = (bytes + kGranularity - 1) / kGranularity * kGranularity;
    fd_ = ::memfd_create("ubep-emulated-gpu-heap", MFD_CLOEXEC);
    if (fd_ < 0) sys_fail(where, "memfd_create");
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      sys_fail(where, "ftruncate of the emulated GPU heap to " + std::to_string(size_) + " bytes");
    }
    base_ = map(fd_, where);
  }
  ~EmulatedHeap() override {
    for (char* p : peers_) {
      if (p && p != base_) ::munmap(p, size_);
    }
    if (base_) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
  }

  void map_node(MPI_Comm node_comm, int world_rank, const char* call, std::chrono::duration<double> timeout,
                const std::function<void(MPI_Request&)>&, const std::string& where) override {
    int me = 0, n = 1;
    MPI_Comm_rank(node_comm, &me);
    MPI_Comm_size(node_comm, &n);
    std::vector<int> fds = exchange_node_fds(node_comm, fd_, world_rank, call, timeout);
    peers_.assign(n, nullptr);
    peers_[me] = base_;
    try {
      for (int r = 0; r < n; ++r) {
        if (r != me) peers_[r] = map(fds[r], where);
      }
    } catch (...) {
      for (int f : fds) ::close(f);
      throw;
    }
    for (int f : fds) ::close(f);
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, const std::string&) override {
    std::memcpy(dst, src, bytes);
  }
  void synchronize(const std::string&) override {}
  std::string describe() const override {
    return std::to_string(size_) +
           " bytes of host memory EMULATING a GPU (UBEP_GPU_EMULATE=1, testing), shared with the node by a memfd "
           "over a Unix socket";
  }

 private:
  char* map(int fd, const std::string& where) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) sys_fail(where, "mmap of " + std::to_string(size_) + " bytes of an emulated GPU heap");
    return static_cast<char*>(p);
  }
  [[noreturn]] void sys_fail(const std::string& where, const std::string& what) {
    const int err = errno;
    throw Error(Errc::internal, where + what + " failed: " + std::strerror(err));
  }
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<DeviceHeap> make_emulated_device_heap(std::size_t bytes, const std::string& where) {
  return std::make_unique<EmulatedHeap>(bytes, where);
}

}  // namespace ubep::detail
