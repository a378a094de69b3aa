// self and shm: the peer's heap is mapped into this process (MPI_Win_allocate_shared on the node
// communicator, or our own heap for self), so a put is a memcpy and an atomic is a CPU atomic on the
// mapped word. Everything completes before the call returns; fence is a release fence.
#pragma once

#include <vector>

#include "transports/transport.hpp"

namespace ubep::detail {

class LoadStoreTransport final : public Transport {
 public:
  /// `bases[pe]` is the mapped address of pe's heap, null for peers that are not mapped.
  explicit LoadStoreTransport(std::vector<char*> bases) : bases_(std::move(bases)) {}
  const char* name() const noexcept override { return "load/store"; }
  void put(std::size_t offset, const void* src, std::size_t bytes, int pe) override;
  void put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) override { put(offset, src, bytes, pe); }
  void get(void* dst, std::size_t offset, std::size_t bytes, int pe) override;
  void get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) override { get(dst, offset, bytes, pe); }
  std::uint64_t fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                             int pe) override;
  void post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) override;
  void fence() override;
  void flush(int) override {}
  void flush_all() override;
  bool outstanding() const noexcept override { return false; }
  char* base(int pe) const { return bases_[pe]; }

 private:
  std::vector<char*> bases_;
};

}  // namespace ubep::detail
