// UcxTransport, initiator side: message headers, the throttle on operations in flight, sends (numbered in the
// stream to their peer) and the tracking of their requests, requests and the wait for their answers.
#include "base/log.hpp"
#include "transports/ucx/ucx_transport.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

using namespace ucx_wire;  // NOLINT: the message kinds

// ---- sending ----------------------------------------------------------------------------------------------

UcxTransport::Msg UcxTransport::header(std::uint8_t kind) const {
  Msg m{};
  m.src = static_cast<std::uint32_t>(rank_);
  m.kind = kind;
  m.version = kVersion;
  return m;
}

void UcxTransport::mark(int pe) {
  if (!dirty_[pe]) {
    dirty_[pe] = 1;
    dirty_list_.push_back(pe);
  }
}

void UcxTransport::throttle(int pe, const char* what) {
  // Answers and forwards sent from inside progress() are never held back (the progress they would wait
  // for is the caller's own).
  if (in_progress_) return;
  if (rdma_[pe] && ++rdma_unflushed_[pe] >= kMaxInFlight) {
    // UCX completes emulated (and bcopy) RMA at once and queues it inside: only a flush bounds that queue.
    rdma_unflushed_[pe] = 0;
    void* req = flush_ep(pe);
    wait(what, pe, [&] { return request_status(req) != UCS_INPROGRESS; });
    finish_flush(req, pe);
  }
  if (sends_.size() + pending_.size() < kMaxInFlight) return;
  progress();
  if (sends_.size() + pending_.size() < kMaxInFlight) return;
  wait(what, pe, [this] { return sends_.size() + pending_.size() <= kMaxInFlight / 2; });
}

ucp_request_param_t UcxTransport::send_param(std::size_t bytes) const {
  ucp_request_param_t p{};
  if (eager_max_ != kUcxEagerAuto && bytes != 0) {
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = bytes <= eager_max_ ? UCP_AM_SEND_FLAG_EAGER : UCP_AM_SEND_FLAG_RNDV;
  }
  return p;
}

void UcxTransport::send(int pe, Msg hdr, const void* buf, std::size_t bytes, bool wait_local, const char* what) {
  if (!is_answer(hdr.kind)) throttle(pe, what);
  send_now(pe, hdr, buf, bytes, wait_local, what);
}

void UcxTransport::send_now(int pe, const Msg& hdr, const void* buf, std::size_t bytes, bool wait_local,
                            const char* what) {
  check_peer(pe, what);
  sends_.push_back(Send{hdr, nullptr, pe});
  Send& s = sends_.back();
  // The sequence number is taken only for a message that goes out: one that fails at once leaves no gap.
  if (!is_answer(hdr.kind)) s.hdr.seq = seq_out_[pe] + 1;
  ucp_request_param_t p = send_param(bytes);
  void* req = ucp_am_send_nbx(eps_[pe], kAmId, &s.hdr, sizeof s.hdr, buf, bytes, &p);
  if (!UCS_PTR_IS_ERR(req) && !is_answer(hdr.kind)) ++seq_out_[pe];
  track(s, req, wait_local, what);
}

void UcxTransport::send_raw_for_testing(int pe, const Msg& m, const void* payload, std::size_t bytes) {
  const auto lock = guard();
  sends_.push_back(Send{m, nullptr, pe});
  ucp_request_param_t p = send_param(bytes);
  track(sends_.back(), ucp_am_send_nbx(eps_[pe], kAmId, &sends_.back().hdr, sizeof m, payload, bytes, &p), true,
        "send_raw_for_testing");
}

std::uint64_t UcxTransport::take_sequence_for_testing(int pe) {
  const auto lock = guard();
  return ++seq_out_[pe];
}

std::uint64_t UcxTransport::track(Send& s, void* req, bool wait_local, const char* what) {
  const int pe = s.pe;
  if (UCS_PTR_IS_ERR(req)) {
    sends_.pop_back();
    const ucs_status_t st = UCS_PTR_STATUS(req);
    if (failed_[pe].empty()) failed_[pe] = std::string("a send to it failed: ") + ucs_status_string(st);
    throw Error(Errc::unreachable, message_prefix(rank_, what) + "an operation to rank " + std::to_string(pe) +
                                       " failed at once: " + ucs_status_string(st) + " (rank " + std::to_string(pe) +
                                       " is unreachable from now on)");
  }
  if (!req) {  // completed in the call
    const std::uint64_t reply = s.reply;
    sends_.pop_back();
    return reply;
  }
  s.req = req;
  if (!wait_local) return 0;
  // This entry is the waiter's: reap_sends() (inside progress) leaves it alone. If the wait times out, the
  // send stays in flight as any other, reaped when UCX completes it (a later quiet() waits for it).
  s.held = true;
  try {
    wait(what, pe, [&s] { return ucp_request_check_status(s.req) != UCS_INPROGRESS; });
  } catch (...) {
    s.held = false;
    throw;
  }
  const ucs_status_t st = ucp_request_check_status(s.req);
  const std::uint64_t reply = s.reply;
  ucp_request_free(s.req);
  for (auto it = sends_.begin(); it != sends_.end(); ++it) {
    if (&*it == &s) {
      sends_.erase(it);
      break;
    }
  }
  if (st != UCS_OK) {
    if (failed_[pe].empty()) failed_[pe] = std::string("a send to it failed: ") + ucs_status_string(st);
    throw Error(Errc::unreachable, message_prefix(rank_, what) + "an operation to rank " + std::to_string(pe) +
                                       " failed: " + ucs_status_string(st));
  }
  return reply;
}

std::uint64_t UcxTransport::expect(std::uint8_t kind, void* dst, std::size_t bytes, int pe) {
  const std::uint64_t token = next_token_++;
  Pending& p = pending_[token];
  p.kind = kind;
  p.dst = dst;
  p.bytes = bytes;
  p.pe = pe;
  return token;
}

std::uint64_t UcxTransport::request(int pe, Msg m, std::uint8_t answer, void* dst, std::size_t dst_bytes, bool keep,
                                    const char* what) {
  check_peer(pe, what);
  throttle(pe, what);  // before anything is registered: a throttle that times out leaves nothing behind
  m.token = expect(answer, dst, dst_bytes, pe);
  pending_[m.token].keep = keep;
  if (answer == get_reply) ++gets_in_flight_[pe];
  try {
    send_now(pe, m, nullptr, 0, false, what);
  } catch (...) {
    pending_.erase(m.token);
    if (answer == get_reply) --gets_in_flight_[pe];
    throw;
  }
  return m.token;
}

void UcxTransport::await(const char* what, int pe, std::uint64_t token) {
  try {
    wait(what, pe, [&] { return pending_.at(token).done; });
  } catch (...) {
    // Nobody waits for it any more: its answer erases it (and uncounts a get) when it comes.
    auto it = pending_.find(token);
    if (it != pending_.end()) {
      if (it->second.done) {
        pending_.erase(it);
      } else {
        it->second.keep = false;
      }
    }
    throw;
  }
}

}  // namespace ubep::detail
