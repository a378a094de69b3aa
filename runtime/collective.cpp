// Checked collectives. Every ubep collective is one non-blocking MPI_Iallreduce of a fixed record
// (kind, sequence number, arguments), so ranks that call different collectives, in a different order,
// or with different arguments all learn it and throw, and ranks that never arrive produce a timeout
// instead of a hang. The record carries each value and its negation, so one MAX gives min and max.
#include <array>
#include <sstream>

#include "runtime/mpi_check.hpp"
#include "runtime/poll.hpp"
#include "runtime/state.hpp"

namespace ubep::detail {

const char* to_string(CollKind kind) noexcept {
  switch (kind) {
    case CollKind::create: return "Context()";
    case CollKind::alloc: return "alloc";
    case CollKind::free: return "free";
    case CollKind::signals: return "alloc_signals";
    case CollKind::barrier: return "barrier";
    case CollKind::finalize: return "finalize";
    case CollKind::moe_setup: return "moe setup";
    case CollKind::user: return "collective";
  }
  return "unknown collective";
}

void State::wait_request(const char* call, MPI_Request& req, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  const auto timeout = options.wait_timeout;
  Backoff backoff(options.poll);
  for (;;) {
    int done = 0;
    UBEP_MPI_CHECK(rank, call, MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    backoff.pause();
    if (timeout.count() > 0 && (backoff.polls() & 63) == 0 && std::chrono::steady_clock::now() - start > timeout) {
      broken = true;  // the request stays pending inside MPI; this context cannot run collectives again
      std::ostringstream msg;
      msg << what << " did not complete within " << timeout.count()
          << " s (UBEP_WAIT_TIMEOUT): not every rank of the communicator (size " << size
          << ") reached it; a rank skipped the call, called another collective, or is stuck elsewhere";
      fail(Errc::timeout, call, msg.str());
    }
  }
}

void State::collective(const char* call, CollKind kind, std::initializer_list<std::int64_t> args,
                       std::initializer_list<const char*> names) {
  constexpr int kFields = 8;
  if (broken) fail(Errc::internal, call, "an earlier collective timed out; this context can no longer synchronize");
  if (args.size() > kFields - 2) fail(Errc::internal, call, "too many collective arguments");
  std::array<std::int64_t, kFields> mine{};
  mine[0] = static_cast<std::int64_t>(kind);
  mine[1] = static_cast<std::int64_t>(++collective_seq);
  std::size_t i = 2;
  for (std::int64_t a : args) mine[i++] = a;
  std::array<std::int64_t, 2 * kFields> send{}, recv{};
  for (int f = 0; f < kFields; ++f) {
    send[f] = mine[f];
    send[kFields + f] = -mine[f];
  }
  MPI_Request req = MPI_REQUEST_NULL;
  UBEP_MPI_CHECK(rank, call, MPI_Iallreduce(send.data(), recv.data(), 2 * kFields, MPI_INT64_T, MPI_MAX, comm, &req));
  const std::string what = std::string("collective ") + to_string(kind) + " #" + std::to_string(mine[1]);
  wait_request(call, req, what.c_str());

  bool agree = true;
  for (int f = 0; f < kFields; ++f) agree = agree && recv[f] == -recv[kFields + f];
  if (agree) return;

  std::ostringstream msg;
  msg << "collective mismatch: this rank called " << to_string(kind) << " (call #" << mine[1];
  std::size_t n = 0;
  for (const char* name : names) {
    if (n + 2 >= kFields) break;
    msg << ", " << name << "=" << mine[n + 2];
    ++n;
  }
  msg << ")";
  const auto lo = [&](int f) { return -recv[kFields + f]; };
  const auto hi = [&](int f) { return recv[f]; };
  if (lo(0) != hi(0)) {
    msg << "; other ranks called " << to_string(static_cast<CollKind>(lo(0))) << " or "
        << to_string(static_cast<CollKind>(hi(0))) << " at the same point";
  } else if (lo(1) != hi(1)) {
    msg << "; ranks are at different call numbers (" << lo(1) << ".." << hi(1) << ")";
  }
  n = 0;
  for (const char* name : names) {
    const int f = static_cast<int>(n + 2);
    if (f >= kFields) break;
    if (lo(f) != hi(f)) msg << "; " << name << " ranges over [" << lo(f) << ", " << hi(f) << "] across ranks";
    ++n;
  }
  fail(Errc::collective_mismatch, call, msg.str());
}

}  // namespace ubep::detail
