// UcxTransport: the operations of the Transport interface (put, get, atomics, signals), each taking the am stream
// or the rdma path of its peer.
#include "base/log.hpp"
#include "transports/ucx/ucx_transport.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

using namespace ucx_wire;  // NOLINT: the message kinds

// ---- the operations ---------------------------------------------------------------------------------------

void UcxTransport::put(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  send_put(offset, src, bytes, pe, true, "put");
}

void UcxTransport::put_nbi(std::size_t offset, const void* src, std::size_t bytes, int pe) {
  send_put(offset, src, bytes, pe, false, "put_nbi");
}

void UcxTransport::send_put(std::size_t offset, const void* src, std::size_t bytes, int pe, bool wait_local,
                            const char* what) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, what);
  mark(pe);
  data_dirty_[pe] = 1;
  if (rdma_[pe]) return rdma_put(offset, src, bytes, pe, wait_local, what);
  Msg m = header(put_data);
  m.offset = offset;
  m.bytes = bytes;
  send(pe, m, src, bytes, wait_local, what);
}

void UcxTransport::get(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "get");
  if (rdma_[pe]) {
    mark(pe);
    return rdma_get(dst, offset, bytes, pe, true, "get");
  }
  mark(pe);
  Msg m = header(get_req);
  m.offset = offset;
  m.bytes = bytes;
  const std::uint64_t token = request(pe, m, get_reply, dst, bytes, true, "get");
  await("get", pe, token);
  const bool failed = pending_.at(token).failed;
  pending_.erase(token);
  if (failed) {  // the error finish_get kept (or an earlier one)
    raise_kept();
    throw Error(Errc::unreachable, message_prefix(rank_, "get") + "the reply of rank " + std::to_string(pe) +
                                       " failed (the destination holds part of it)");
  }
}

void UcxTransport::get_nbi(void* dst, std::size_t offset, std::size_t bytes, int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "get_nbi");
  mark(pe);
  if (rdma_[pe]) return rdma_get(dst, offset, bytes, pe, false, "get_nbi");
  Msg m = header(get_req);
  m.offset = offset;
  m.bytes = bytes;
  (void)request(pe, m, get_reply, dst, bytes, false, "get_nbi");
}

std::uint64_t UcxTransport::fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                                         int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "atomic");
  mark(pe);
  if (rdma_[pe]) return rdma_atomic(op, offset, operand, compare, pe, true, "atomic");
  Msg m = header(fetch_req);
  m.op = static_cast<std::uint8_t>(op);
  m.offset = offset;
  m.value = operand;
  m.compare = compare;
  const std::uint64_t token = request(pe, m, fetch_reply, nullptr, 0, true, "atomic");
  await("atomic", pe, token);
  const std::uint64_t value = pending_.at(token).value;
  pending_.erase(token);
  return value;
}

void UcxTransport::post_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, "atomic");
  mark(pe);
  if (rdma_[pe]) {
    rdma_atomic(op, offset, operand, 0, pe, false, "atomic");
    return;
  }
  Msg m = header(atomic_post);
  m.op = static_cast<std::uint8_t>(op);
  m.offset = offset;
  m.value = operand;
  send(pe, m, nullptr, 0, false, "atomic");
}

void UcxTransport::post_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  const auto lock = guard();
  raise_kept();
  // The stream (am) or a fence (rdma) orders the signal after every earlier operation to pe: nothing to wait for.
  if (rdma_[pe]) return rdma_signal(op, offset, operand, pe);
  post_atomic(op, offset, operand, pe);
}

bool UcxTransport::put_with_signal(std::size_t offset, const void* src, std::size_t bytes, AtomicOp op,
                                   std::size_t sig_offset, std::uint64_t value, int pe, bool wait_local) {
  const auto lock = guard();
  raise_kept();
  check_peer(pe, wait_local ? "put_signal" : "put_signal_nbi");
  mark(pe);
  if (bytes) data_dirty_[pe] = 1;
  if (rdma_[pe]) {  // put, fence, signal: no message for the target's CPU on a hardware lane
    rdma_put(offset, src, bytes, pe, wait_local, wait_local ? "put_signal" : "put_signal_nbi");
    rdma_signal(op, sig_offset, value, pe);
    return true;
  }
  Msg m = header(put_signal);
  m.offset = offset;
  m.bytes = bytes;
  m.op = static_cast<std::uint8_t>(op);
  m.compare = sig_offset;
  m.value = value;
  send(pe, m, src, bytes, wait_local, wait_local ? "put_signal" : "put_signal_nbi");
  return true;
}

}  // namespace ubep::detail
