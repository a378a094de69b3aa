// UcxTransport, target side: the checks of every arrived message (wire.hpp, sequence numbers, answer tokens), the
// ordered stream of each source, the writes and CPU atomics it applies, and the answers it owes.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "base/log.hpp"
#include "transports/ucx/ucx_transport.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

namespace {

using namespace ucx_wire;  // NOLINT: the message kinds

static_assert(static_cast<int>(AtomicOp::fetch_add) == op_fetch_add && static_cast<int>(AtomicOp::set) == op_set,
              "the wire's op numbers are AtomicOp's");

std::atomic_ref<std::uint64_t> word(char* base, std::size_t offset) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(base + offset));
}

/// Applies an atomic to a local word with a CPU atomic; returns the old value.
std::uint64_t apply_atomic(std::atomic_ref<std::uint64_t> w, AtomicOp op, std::uint64_t operand,
                           std::uint64_t compare) {
  switch (op) {
    case AtomicOp::fetch_add:
    case AtomicOp::add: return w.fetch_add(operand, std::memory_order_acq_rel);
    case AtomicOp::swap:
    case AtomicOp::set: return w.exchange(operand, std::memory_order_acq_rel);
    case AtomicOp::compare_swap: {
      std::uint64_t expected = compare;
      w.compare_exchange_strong(expected, operand, std::memory_order_acq_rel, std::memory_order_acquire);
      return expected;
    }
    case AtomicOp::fetch: return w.load(std::memory_order_acquire);
  }
  return 0;
}

}  // namespace

// ---- target side ----------------------------------------------------------------------------------

ucs_status_t UcxTransport::on_message(const Msg& m, void* data, std::size_t length, bool rndv) {
  if (closing_) return UCS_OK;  // dropped (a rendezvous is released by UCX)
  const std::string why = check_message(m, length, rndv, Limits{nranks_, heap_bytes_});
  const int src = m.src < static_cast<std::uint32_t>(nranks_) ? static_cast<int>(m.src) : -1;
  if (!why.empty()) {
    violation(src, m, why);
    return UCS_OK;
  }
  if (!isolated_[src].empty()) return UCS_OK;  // everything of an isolated peer is dropped
  ++landed_;
  if (is_answer(m.kind)) return on_answer(m, data, length, rndv);
  Source& so = sources_[src];
  if (m.seq < so.next || m.seq - so.next >= kReorderWindow || so.early.count(m.seq) != 0) {
    violation(src, m,
              "field 'seq' = " + std::to_string(m.seq) + ": expected " + std::to_string(so.next) +
                  (m.seq < so.next || so.early.count(m.seq) != 0 ? " (a duplicate)" : " (too far ahead)"));
    return UCS_OK;
  }
  const bool in_turn = m.seq == so.next;
  if (in_turn && !rndv && so.backlog.empty()) {  // the common case: apply at once
    ++so.next;
    apply(m, data, length);
    if (so.early.empty()) return UCS_OK;
  } else {
    Incoming in;
    in.m = m;
    in.rndv = rndv;
    if (rndv) {
      in.desc = data;
    } else {
      const auto* b = static_cast<const std::byte*>(data);
      in.data.assign(b, b + length);
    }
    if (in_turn) {
      ++so.next;
      so.backlog.push_back(std::move(in));
    } else {
      so.early.emplace(m.seq, std::move(in));
    }
  }
  // Whatever arrived early and is now in turn joins the backlog (drain() applies it).
  for (auto it = so.early.begin(); it != so.early.end() && it->first == so.next; it = so.early.erase(it)) {
    so.backlog.push_back(std::move(it->second));
    ++so.next;
  }
  if (std::find(backlogged_.begin(), backlogged_.end(), src) == backlogged_.end()) backlogged_.push_back(src);
  return rndv ? UCS_INPROGRESS : UCS_OK;
}

ucs_status_t UcxTransport::on_answer(const Msg& m, void* data, std::size_t length, bool rndv) {
  // Answers to this rank: not part of any source's ordered stream of writes.
  const int src = static_cast<int>(m.src);
  auto it = pending_.find(m.token);
  if (it == pending_.end() || it->second.pe != src || it->second.kind != m.kind) {
    violation(src, m,
              "field 'token' = " + std::to_string(m.token) +
                  (it == pending_.end()   ? ": this rank awaits no such answer"
                   : it->second.pe != src ? ": it was asked of rank " + std::to_string(it->second.pe)
                                          : ": it awaits a " + kind_name(it->second.kind)));
    return UCS_OK;
  }
  Pending& p = it->second;
  if (m.kind == fetch_reply) p.value = m.value;
  if (m.kind == get_reply) {
    if (length != p.bytes) {
      violation(src, m,
                "field 'length' = " + std::to_string(length) + ": the get asked for " + std::to_string(p.bytes));
      return UCS_OK;  // the get stays unanswered: its wait times out naming the peer
    }
    if (rndv) {
      p.desc = data;  // received into p.dst after the handlers ran
      get_rndv_tokens_.push_back(m.token);
      return UCS_INPROGRESS;
    }
    std::memcpy(p.dst, data, length);
    --gets_in_flight_[p.pe];
  }
  if (!p.keep) {
    pending_.erase(it);  // get_nbi, or a waiter that gave up: nobody looks at this entry again
    return UCS_OK;
  }
  p.done = true;
  return UCS_OK;
}

void UcxTransport::apply(const Msg& m, const void* data, std::size_t length) {
  // check_message passed: every offset and length is inside the heap, every word aligned, every op valid.
  const int src = static_cast<int>(m.src);
  switch (m.kind) {
    case put_data:
      if (length) std::memcpy(base_ + m.offset, data, length);
      break;
    case put_signal:
      if (length) std::memcpy(base_ + m.offset, data, length);
      apply_atomic(word(base_, m.compare), static_cast<AtomicOp>(m.op), m.value, 0);  // release: after the data
      break;
    case atomic_post: apply_atomic(word(base_, m.offset), static_cast<AtomicOp>(m.op), m.value, 0); break;
    case get_req: {
      Msg r = header(get_reply);
      r.token = m.token;
      answer(src, r, base_ + m.offset, m.bytes);
      break;
    }
    case fetch_req: {
      Msg r = header(fetch_reply);
      r.token = m.token;
      r.value = apply_atomic(word(base_, m.offset), static_cast<AtomicOp>(m.op), m.value, m.compare);
      answer(src, r, nullptr, 0);
      break;
    }
    case flush_req: {
      Msg r = header(flush_reply);
      r.token = m.token;
      answer(src, r, nullptr, 0);
      break;
    }
    default: break;
  }
}

void UcxTransport::answer(int to, Msg reply, const void* buf, std::size_t bytes) {
  owed_.push_back(Answer{to, reply, buf, bytes});  // sent after the handlers ran, not from inside one
}

void UcxTransport::drain_source(int src) {
  std::deque<Incoming>& q = sources_[src].backlog;
  while (!q.empty() && isolated_[src].empty()) {
    Incoming& in = q.front();
    if (in.rndv) {
      if (in.desc) {
        ucp_request_param_t rp{};
        void* req = ucp_am_recv_data_nbx(worker_, in.desc, base_ + in.m.offset, in.m.bytes, &rp);
        in.desc = nullptr;
        if (UCS_PTR_IS_ERR(req)) {
          keep_error(std::make_exception_ptr(
              Error(Errc::unreachable, message_prefix(rank_, "ucx") + "receiving a put of rank " + std::to_string(src) +
                                           " failed: " + ucs_status_string(UCS_PTR_STATUS(req)))));
          q.pop_front();
          continue;
        }
        in.req = req;
      }
      if (in.req) {
        if (ucp_request_check_status(in.req) == UCS_INPROGRESS) return;
        ucp_request_free(in.req);
        in.req = nullptr;
      }
      if (in.m.kind == put_signal) {  // the data is in: now the signal
        apply_atomic(word(base_, in.m.compare), static_cast<AtomicOp>(in.m.op), in.m.value, 0);
      }
      ++landed_;
    } else {
      apply(in.m, in.data.data(), in.data.size());
    }
    q.pop_front();
  }
  if (!isolated_[src].empty()) {  // an isolated source's rendezvous data is released, never received
    for (Incoming& in : q) {
      if (in.desc) ucp_am_data_release(worker_, in.desc);
      in.desc = nullptr;
    }
  }
}

void UcxTransport::drain() {
  // Rendezvous receives of get replies, straight into the caller's buffer.
  for (std::uint64_t token : get_rndv_tokens_) {
    auto it = pending_.find(token);
    if (it == pending_.end()) continue;
    Pending& p = it->second;
    ucp_request_param_t rp{};
    void* req = ucp_am_recv_data_nbx(worker_, p.desc, p.dst, p.bytes, &rp);
    p.desc = nullptr;
    if (UCS_PTR_IS_PTR(req)) {
      p.req = req;
      continue;
    }
    finish_get(p, UCS_PTR_STATUS(req));  // received in the call (UCS_OK), or failed at once
    if (!p.keep) pending_.erase(it);
  }
  get_rndv_tokens_.clear();
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    const ucs_status_t st = p.req ? ucp_request_check_status(p.req) : UCS_INPROGRESS;
    if (st != UCS_INPROGRESS) {
      ucp_request_free(p.req);
      p.req = nullptr;
      finish_get(p, st);
      if (!p.keep) {
        it = pending_.erase(it);
        continue;
      }
    }
    ++it;
  }
  // Each source's backlog, in order: a rendezvous at the head holds back everything behind it.
  for (std::size_t i = 0; i < backlogged_.size();) {
    const int src = backlogged_[i];
    drain_source(src);
    const Source& so = sources_[src];
    if (so.backlog.empty() && so.early.empty()) {
      backlogged_[i] = backlogged_.back();
      backlogged_.pop_back();
    } else {
      ++i;
    }
  }
  // The answers owed, in the order they were earned. One that cannot go out (its peer failed) is dropped; the
  // others still go (a dead peer must not make every live one wait and blame this rank).
  std::vector<Answer> owed;
  owed.swap(owed_);
  for (const Answer& a : owed) {
    if (!isolated_[a.to].empty()) continue;
    if (!failed_[a.to].empty()) {
      if (dropped_answers_[a.to]++ == 0) {  // said once per peer
        keep_error(std::make_exception_ptr(
            Error(Errc::unreachable, message_prefix(rank_, "ucx") + "rank " + std::to_string(a.to) +
                                         " is unreachable (" + failed_[a.to] + "): the answers this rank owes it (" +
                                         kind_name(a.m.kind) + ", ...) are dropped; the other peers are served")));
      }
      continue;
    }
    try {
      send(a.to, a.m, a.buf, a.bytes, false, "ucx answer");
    } catch (const Error&) {
      keep_error(std::current_exception());
    }
  }
}

}  // namespace ubep::detail
