// UcxTransport: progress (the worker, then the handlers' backlog, then completed sends), the bounded wait every
// blocking call polls with, and the progress thread's pass and event-fd sleeping (ucx_transport.hpp, "Progress").
#include <algorithm>

#include "base/log.hpp"
#include "base/poll.hpp"
#include "transports/ucx/ucx_transport.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

void UcxTransport::reap_sends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (it->held) {
      ++it;
      continue;
    }
    const ucs_status_t st = request_status(it->req);
    if (st == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    if (it->req) ucp_request_free(it->req);
    if (st != UCS_OK) {
      const int pe = it->pe;
      if (failed_[pe].empty()) {
        failed_[pe] = std::string("a message to it failed: ") + ucs_status_string(st);
        keep_error(std::make_exception_ptr(Error(
            Errc::unreachable, message_prefix(rank_, "ucx") + "a message to rank " + std::to_string(pe) + " failed: " +
                                   ucs_status_string(st) + " (rank " + std::to_string(pe) + " is unreachable)")));
      }
    }
    it = sends_.erase(it);
  }
}

void UcxTransport::wait(const char* what, int pe, const std::function<bool()>& done) {
  const auto start = std::chrono::steady_clock::now();
  Backoff backoff(poll_);
  std::uint64_t turns = 0;  // every 16th turn checks the deadline: a pass where a message landed skips the pause
  for (;;) {
    const bool landed = progress();
    if (done()) return;
    check_peer(pe, what);  // a peer that failed (or was isolated) meanwhile never answers
    if (!landed) backoff.pause();
    if (timeout_.count() > 0 && (++turns & 15) == 0) {
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
      if (waited > timeout_) {
        throw Error(Errc::timeout, message_prefix(rank_, what) + "no answer from rank " + std::to_string(pe) +
                                       " over ucx within " + std::to_string(waited.count()) +
                                       " s (UBEP_WAIT_TIMEOUT); rank " + std::to_string(pe) +
                                       " must progress for messages to land (a ubep call or its progress thread: "
                                       "stalled, dead, or UBEP_PROGRESS_THREAD=0 while it computes); the "
                                       "operation stays in flight and a later quiet() completes it");
      }
    }
  }
}

bool UcxTransport::progress() {
  const auto lock = guard();
  if (!in_thread_) app_polls_.fetch_add(1, std::memory_order_relaxed);  // the caller's thread serves the worker
  if (in_progress_) return false;  // a send inside drain() must not re-enter the handlers
  in_progress_ = true;
  const std::uint64_t landed = landed_;
  try {
    // Until a message lands (then the caller looks at what it waits for) or nothing moves. Not until nothing
    // moves in any case: that last, empty turn (a poll of the TCP sockets) sat between the arrival of a signal and
    // its waiter's return, +0.4 us of 8 us one way across two emulated nodes (docs/MULTINODE.md).
    while (ucp_worker_progress(worker_) != 0 && landed_ == landed) {
    }
    drain();
    reap_sends();
  } catch (...) {
    in_progress_ = false;
    keep_error(std::current_exception());
  }
  in_progress_ = false;
  raise_kept();
  return landed_ != landed;
}

void UcxTransport::poll_keeping_errors() noexcept {
  const auto lock = guard();
  app_polls_.fetch_add(1, std::memory_order_relaxed);
  thread_pass();
}

void UcxTransport::thread_pass() noexcept {
  const auto lock = guard();
  in_thread_ = true;
  try {
    progress();
  } catch (...) {
    keep_error(std::current_exception());
  }
  in_thread_ = false;
}

bool UcxTransport::arm() noexcept {
  const auto lock = guard();
  return ucp_worker_arm(worker_) == UCS_OK;
}

bool UcxTransport::busy() noexcept {
  const auto lock = guard();
  return !sends_.empty() || !backlogged_.empty() ||
         std::any_of(pending_.begin(), pending_.end(), [](const auto& p) { return p.second.req != nullptr; });
}

}  // namespace ubep::detail
