// UcxTransport, rdma mode: put, get and atomics as UCP RMA and atomic operations on the peer's mapped heap, each
// signal behind a worker fence; fence(); endpoint flushes (ucx_transport.hpp, "rdma").
#include "base/log.hpp"
#include "transports/ucx/ucx_transport.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

void UcxTransport::rdma_put(std::size_t offset, const void* src, std::size_t bytes, int pe, bool wait_local,
                            const char* what) {
  check_peer(pe, what);
  throttle(pe, what);
  sends_.push_back(Send{Msg{}, nullptr, pe});
  ucp_request_param_t p{};
  track(sends_.back(), ucp_put_nbx(eps_[pe], src, bytes, remote_base_[pe] + offset, rkeys_[pe], &p), wait_local, what);
}

void UcxTransport::rdma_get(void* dst, std::size_t offset, std::size_t bytes, int pe, bool wait, const char* what) {
  check_peer(pe, what);
  throttle(pe, what);
  sends_.push_back(Send{Msg{}, nullptr, pe});
  ucp_request_param_t p{};
  track(sends_.back(), ucp_get_nbx(eps_[pe], dst, bytes, remote_base_[pe] + offset, rkeys_[pe], &p), wait, what);
}

std::uint64_t UcxTransport::rdma_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare,
                                        int pe, bool fetching, const char* what) {
  check_peer(pe, what);
  throttle(pe, what);
  ucp_worker_fence(worker_);  // release: after every earlier operation of this rank
  sends_.push_back(Send{Msg{}, nullptr, pe});
  Send& s = sends_.back();
  s.operand = operand;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(sizeof(std::uint64_t));
  ucp_atomic_op_t uop = UCP_ATOMIC_OP_ADD;
  bool reply = true;
  switch (op) {
    case AtomicOp::fetch_add: break;
    case AtomicOp::add: reply = false; break;
    case AtomicOp::swap:
    case AtomicOp::set: uop = UCP_ATOMIC_OP_SWAP; break;  // UCP has no non-fetching set: a swap, reply unused
    case AtomicOp::compare_swap:  // buffer = the compare value, reply buffer = the new one, then the old one
      uop = UCP_ATOMIC_OP_CSWAP;
      s.operand = compare;
      s.reply = operand;
      break;
    case AtomicOp::fetch:
      uop = UCP_ATOMIC_OP_OR;
      s.operand = 0;
      break;
  }
  if (reply) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    p.reply_buffer = &s.reply;
  }
  return track(s, ucp_atomic_op_nbx(eps_[pe], uop, &s.operand, 1, remote_base_[pe] + offset, rkeys_[pe], &p), fetching,
               what);
}

void UcxTransport::rdma_signal(AtomicOp op, std::size_t offset, std::uint64_t operand, int pe) {
  mark(pe);
  if (op == AtomicOp::add) {
    rdma_atomic(op, offset, operand, 0, pe, false, "put_signal");
    return;
  }
  check_peer(pe, "put_signal");
  throttle(pe, "put_signal");
  ucp_worker_fence(worker_);
  sends_.push_back(Send{Msg{}, nullptr, pe});
  Send& s = sends_.back();
  s.operand = operand;
  ucp_request_param_t p{};
  track(s, ucp_put_nbx(eps_[pe], &s.operand, sizeof s.operand, remote_base_[pe] + offset, rkeys_[pe], &p), false,
        "put_signal");
}

void UcxTransport::fence() {
  const auto lock = guard();                 // the progress thread may be inside the worker
  if (any_rdma_) ucp_worker_fence(worker_);  // am: one ordered stream per peer already
}

void* UcxTransport::flush_ep(int pe) {
  ucp_request_param_t p{};
  void* req = ucp_ep_flush_nbx(eps_[pe], &p);
  if (UCS_PTR_IS_ERR(req)) fail("ucp_ep_flush_nbx", UCS_PTR_STATUS(req));
  return req;
}

void UcxTransport::finish_flush(void* req, int pe) {
  const ucs_status_t st = request_status(req);
  if (req) ucp_request_free(req);
  if (st != UCS_OK) {
    throw Error(Errc::unreachable, message_prefix(rank_, "flush") + "ucp_ep_flush_nbx to rank " + std::to_string(pe) +
                                       " failed: " + ucs_status_string(st));
  }
}

}  // namespace ubep::detail
