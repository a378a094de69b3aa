#include "transports/load_store.hpp"

#include <atomic>
#include <cstring>

#include "ubep/error.hpp"

namespace ubep::detail {
namespace {
std::atomic_ref<std::uint64_t> word(char* base, std::size_t offset) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base + offset));
}
}  // namespace

void LoadStoreTransport::put(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  std::memcpy(bases_[pe] + offset, src, bytes);
}

void LoadStoreTransport::get(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  std::memcpy(dst, bases_[pe] + offset, bytes);
}

std::uint64_t LoadStoreTransport::fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand,
                                               std::uint64_t compare, int pe) {
  auto w = word(bases_[pe], offset);
  switch (op) {
    case AtomicOp::fetch_add: return w.fetch_add(operand, std::memory_order_acq_rel);
    case AtomicOp::swap: return w.exchange(operand, std::memory_order_acq_rel);
    case AtomicOp::fetch: return w.load(std::memory_order_acquire);
    case AtomicOp::compare_swap: {
      std::uint64_t expected = compare;
      w.compare_exchange_strong(expected, operand, std::memory_order_acq_rel, std::memory_order_acquire);
      return expected;
    }
    default: break;
  }
  throw Error(Errc::internal, "ubep: load/store transport: not a fetching atomic");
}

void LoadStoreTransport::post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  // Release: the data this rank stored before (memcpy into the same mapping) is visible to whoever
  // acquires the new value.
  if (op != AtomicOp::add && op != AtomicOp::set) {
    throw Error(Errc::internal, "ubep: load/store transport: not a posted atomic");
  }
  apply_posted(bases_[pe], offset, op, operand);
}

void LoadStoreTransport::fence() { std::atomic_thread_fence(std::memory_order_release); }

void LoadStoreTransport::flush_all() { std::atomic_thread_fence(std::memory_order_seq_cst); }

}  // namespace ubep::detail
