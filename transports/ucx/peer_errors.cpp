// UcxTransport: failed and isolated peers, and the error kept for the caller's thread (ucx_transport.hpp,
// "Failures").
#include <utility>

#include "base/log.hpp"
#include "transports/ucx/ucx_transport.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

using namespace ucx_wire;  // NOLINT: the message kinds

// ---- errors: failed and isolated peers -----------------------------------------------------------------

void UcxTransport::keep_error(std::exception_ptr error) {
  if (!kept_) kept_ = std::move(error);
}

void UcxTransport::raise_kept() {
  if (kept_ && !in_thread_) std::rethrow_exception(std::exchange(kept_, nullptr));
}

void UcxTransport::on_endpoint_error(int pe, ucs_status_t status) {
  // Also how a peer that finalized first looks (it closed its endpoints): no error of its own, only what an
  // operation to the peer then gets (check_peer), and the answers owed to it (drain) that cannot go.
  if (closing_ || !failed_[pe].empty()) return;
  failed_[pe] = std::string("its endpoint failed: ") + ucs_status_string(status) +
                " (it died or finalized, or the "
                "network failed)";
}

void UcxTransport::finish_get(Pending& p, ucs_status_t status) {
  if (status == UCS_OK && std::exchange(fail_next_get_reply_, false)) status = UCS_ERR_ENDPOINT_TIMEOUT;  // tests
  --gets_in_flight_[p.pe];
  ++landed_;
  p.done = true;
  if (status == UCS_OK) return;
  // Part of the reply may have landed: never reported as a completed get. (Where the endpoint failed, UCX has also
  // called on_endpoint_error, and the peer is unreachable from then on.)
  p.failed = true;
  keep_error(std::make_exception_ptr(Error(
      Errc::unreachable, message_prefix(rank_, p.keep ? "get" : "get_nbi") + "the reply of rank " +
                             std::to_string(p.pe) + " to a get of " + std::to_string(p.bytes) +
                             " bytes failed: " + ucs_status_string(status) + " (the destination holds part of it)")));
}

void UcxTransport::fail_next_get_reply_for_testing() {
  const auto lock = guard();  // the progress thread reads it in drain()
  fail_next_get_reply_ = true;
}

void UcxTransport::check_peer(int pe, const char* what) const {
  if (!failed_[pe].empty()) {
    throw Error(Errc::unreachable,
                message_prefix(rank_, what) + "rank " + std::to_string(pe) + " is unreachable: " + failed_[pe]);
  }
  if (!isolated_[pe].empty()) {
    throw Error(Errc::protocol, message_prefix(rank_, what) + "rank " + std::to_string(pe) +
                                    " was isolated after a protocol violation: " + isolated_[pe]);
  }
}

void UcxTransport::violation(int src, const Msg& m, const std::string& what) {
  const bool known = src >= 0 && src < nranks_;
  std::string text = "a " + kind_name(m.kind) + " message from " +
                     (known ? "rank " + std::to_string(src) : std::string("an unknown source")) +
                     " breaks the wire protocol: " + what + "; it was dropped";
  if (known && isolated_[src].empty()) {
    isolated_[src] = text;
    text += ", and rank " + std::to_string(src) + " is isolated (its messages dropped, operations to it refused)";
  }
  keep_error(std::make_exception_ptr(Error(Errc::protocol, message_prefix(rank_, "ucx") + text)));
}

}  // namespace ubep::detail
