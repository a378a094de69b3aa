// Checked collectives. Every ubep collective is one non-blocking MPI_Iallreduce of a fixed record
// (kind, sequence number, arguments), so ranks that call different collectives, in a different order,
// or with different arguments all learn it and throw, and ranks that never arrive produce a timeout
// instead of a hang. The record carries each value and its negation, so one MAX gives min and max.
#include <array>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "base/mpi_check.hpp"
#include "base/poll.hpp"
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
    if (ucx) ucx->poll();  // a peer may wait for this rank's answer before it joins
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
  constexpr int kFields = 10;
  // Both are the caller's situation, not a bug in ubep: a peer that never joined an earlier collective
  // (its request is still pending inside MPI), or more values than one record carries.
  if (broken) {
    fail(Errc::timeout, call,
         "an earlier collective of this context timed out (a peer never joined it); the context can no longer "
         "run collectives: finalize() cannot complete either, end the job");
  }
  if (args.size() > kFields - 2) {
    fail(Errc::invalid_argument, call,
         std::to_string(args.size()) + " values to agree on; at most " + std::to_string(kFields - 2) + " per call");
  }
  std::array<std::int64_t, kFields> mine{};
  mine[0] = static_cast<std::int64_t>(kind);
  mine[1] = static_cast<std::int64_t>(++collective_seq);
  std::size_t i = 2;
  for (std::int64_t a : args) mine[i++] = a;
  // The buffers live on the heap: when the wait times out the request stays pending inside MPI, and a
  // rank that arrives later completes it, so MPI may still write them; they are then left allocated.
  auto buffers = std::make_unique<std::array<std::int64_t, 4 * kFields>>();
  std::int64_t* send = buffers->data();
  std::int64_t* recv = send + 2 * kFields;
  for (int f = 0; f < kFields; ++f) {
    send[f] = mine[f];
    send[kFields + f] = -mine[f];
    recv[f] = recv[kFields + f] = 0;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  UBEP_MPI_CHECK(rank, call, MPI_Iallreduce(send, recv, 2 * kFields, MPI_INT64_T, MPI_MAX, comm, &req));
  const std::string what = std::string("collective ") + to_string(kind) + " #" + std::to_string(mine[1]);
  try {
    wait_request(call, req, what.c_str());
  } catch (...) {
    if (req != MPI_REQUEST_NULL) {  // MPI still owns them: keep them for the life of the process
      static std::mutex lock;
      static std::vector<std::unique_ptr<std::array<std::int64_t, 4 * kFields>>> abandoned;
      const std::lock_guard<std::mutex> hold(lock);
      abandoned.push_back(std::move(buffers));
    }
    throw;
  }

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
