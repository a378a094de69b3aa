// UcxTransport: flush(pe), quiet (flush_all), flush_local and the flush before a signal: one round trip for every
// peer together, a counted request on the am stream or ucp_ep_flush_nbx on rdma (ucx_transport.hpp, "Ordering").
#include <algorithm>

#include "transports/ucx/ucx_transport.hpp"

namespace ubep::detail {

using namespace ucx_wire;  // NOLINT: the message kinds

bool UcxTransport::sends_done(int pe) {
  reap_sends();
  return std::none_of(sends_.begin(), sends_.end(), [pe](const Send& s) { return s.pe == pe; });
}

bool UcxTransport::flushed(int pe, std::uint64_t token) {
  return pending_.at(token).done && gets_in_flight_[pe] == 0 && sends_done(pe);
}

void UcxTransport::flush(int pe) {
  const auto lock = guard();
  raise_kept();
  if (!dirty_[pe]) return;
  flush_peers({pe}, "flush");
}

void UcxTransport::flush_local(int pe) {
  const auto lock = guard();
  raise_kept();
  const auto done = [&] { return gets_in_flight_[pe] == 0 && sends_done(pe); };
  if (!done()) wait("flush_local", pe, done);
}

void UcxTransport::flush_all() {
  const auto lock = guard();
  raise_kept();
  const std::vector<int> peers = dirty_list_;
  flush_peers(peers, "quiet");
}

void UcxTransport::order_before_signal(int pe) {
  const auto lock = guard();
  raise_kept();
  std::vector<int> peers;
  for (int q : dirty_list_) {
    if (q != pe && data_dirty_[q]) peers.push_back(q);
  }
  if (!peers.empty()) flush_peers(peers, "signal_op");
}

void UcxTransport::flush_peers(const std::vector<int>& peers, const char* what) {
  // All requests first, then all answers: one round trip for every peer together. An rdma peer's
  // request is ucp_ep_flush_nbx (its completion proves remote completion); an am peer's, a message.
  struct Flush {
    int pe;
    std::uint64_t token;
    void* req;
  };
  std::vector<Flush> flushes;
  // Whatever throws, no request is left behind unanswered-for: flush answers of peers not yet waited for are
  // left to erase themselves, ucp flush requests to be freed.
  const auto abandon = [&](std::size_t from) {
    for (std::size_t i = from; i < flushes.size(); ++i) {
      if (flushes[i].req) {
        ucp_request_free(flushes[i].req);  // UCX completes it, then frees it
      } else if (auto it = pending_.find(flushes[i].token); it != pending_.end()) {
        if (it->second.done) {
          pending_.erase(it);
        } else {
          it->second.keep = false;
        }
      }
    }
  };
  try {
    for (int pe : peers) {
      if (rdma_[pe]) {
        check_peer(pe, what);
        flushes.push_back({pe, 0, flush_ep(pe)});
        continue;
      }
      Msg m = header(flush_req);
      flushes.push_back({pe, request(pe, m, flush_reply, nullptr, 0, true, what), nullptr});
    }
  } catch (...) {
    abandon(0);
    throw;
  }
  for (std::size_t i = 0; i < flushes.size(); ++i) {
    const Flush& f = flushes[i];
    try {
      if (rdma_[f.pe]) {
        wait(what, f.pe, [&] { return request_status(f.req) != UCS_INPROGRESS && sends_done(f.pe); });
        flushes[i].req = nullptr;
        finish_flush(f.req, f.pe);
      } else {
        wait(what, f.pe, [&] { return flushed(f.pe, f.token); });
        pending_.erase(f.token);
      }
    } catch (...) {
      abandon(i);
      throw;
    }
    unmark(f.pe);
  }
}

void UcxTransport::unmark(int pe) {
  dirty_[pe] = 0;
  data_dirty_[pe] = 0;
  dirty_list_.erase(std::remove(dirty_list_.begin(), dirty_list_.end(), pe), dirty_list_.end());
}

}  // namespace ubep::detail
