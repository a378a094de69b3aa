// Checked collectives. Every ubep collective is one non-blocking MPI_Iallreduce of a fixed record
// (kind, sequence number, arguments), so ranks that call different collectives, in a different order,
// or with different arguments all learn it and throw, and ranks that never arrive produce a timeout
// instead of a hang. The record carries each value and its negation, so one MAX gives min and max.
// An allreduce cannot say who is missing, so a rank whose collective timed out holds a roll call (below)
// before it throws, and names the ranks that did not answer from inside the collective.
#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "base/mpi_check.hpp"
#include "base/poll.hpp"
#include "runtime/state.hpp"

namespace ubep::detail {

namespace {

// The roll call: point-to-point messages on the context's own communicator, which carries no other
// point-to-point traffic. A rank whose collective #q timed out sends q to every peer; a peer that is
// polling a collective (wait_request, or its own roll call) answers {q, its collective number}.
constexpr int kRollQuery = 0x7562, kRollReply = 0x7563;

// Messages of the roll call go out with MPI_Isend to peers that may be dead, so their requests are freed at
// once and their buffers stay here (reachable, for the life of the process): MPI may read them later. Only
// failure paths send them, a few per peer.
struct Outbox {
  std::mutex lock;
  std::vector<std::unique_ptr<std::array<std::int64_t, 2>>> kept;
  void send(std::int64_t a, std::int64_t b, int to, int tag, MPI_Comm comm) {
    const std::lock_guard<std::mutex> hold(lock);
    kept.push_back(std::make_unique<std::array<std::int64_t, 2>>(std::array<std::int64_t, 2>{a, b}));
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(kept.back()->data(), 2, MPI_INT64_T, to, tag, comm, &req) == MPI_SUCCESS) MPI_Request_free(&req);
  }
};
Outbox& outbox() {
  static Outbox box;
  return box;
}

// Answers the roll-call queries that have arrived; never waits. MPI errors (a dead asker) are ignored.
void answer_roll_call(const State& s) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kRollQuery, s.comms.comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    std::array<std::int64_t, 2> q{};
    if (MPI_Recv(q.data(), 2, MPI_INT64_T, st.MPI_SOURCE, kRollQuery, s.comms.comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    outbox().send(q[0], static_cast<std::int64_t>(s.collective_seq), st.MPI_SOURCE, kRollReply, s.comms.comm);
  }
}

// After collective #seq timed out on this rank: asks every peer, for at most `grace`, which collective it is
// polling. Returns, per rank, that collective's number, or -1 when the rank did not answer (dead, stalled,
// or outside ubep's collectives). A peer in the same collective answers within microseconds; all that waits
// the whole grace is a rank that is missing.
std::vector<std::int64_t> roll_call(const State& s, std::int64_t seq, std::chrono::duration<double> grace) {
  std::vector<std::int64_t> at(s.comms.size, -1);
  at[s.comms.rank] = seq;
  for (int pe = 0; pe < s.comms.size; ++pe) {
    if (pe != s.comms.rank) outbox().send(seq, 0, pe, kRollQuery, s.comms.comm);
  }
  int missing = s.comms.size - 1;
  const auto end = std::chrono::steady_clock::now() + grace;
  Backoff backoff(s.options.poll);
  while (missing > 0 && std::chrono::steady_clock::now() < end) {
    answer_roll_call(s);  // peers whose copy timed out too ask at the same time
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kRollReply, s.comms.comm, &flag, &st) == MPI_SUCCESS && flag) {
      std::array<std::int64_t, 2> r{};
      if (MPI_Recv(r.data(), 2, MPI_INT64_T, st.MPI_SOURCE, kRollReply, s.comms.comm, MPI_STATUS_IGNORE) ==
              MPI_SUCCESS &&
          r[0] == seq && at[st.MPI_SOURCE] < 0) {  // a late answer to an earlier roll call does not count
        at[st.MPI_SOURCE] = r[1];
        --missing;
      }
      continue;
    }
    if (s.routes.ucx) s.routes.ucx->poll_keeping_errors();
    backoff.pause();
  }
  return at;
}

}  // namespace

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
    case CollKind::alloc_device: return "alloc_device";
  }
  return "unknown collective";
}

void State::wait_request(const char* call, MPI_Request& req, const char* what) {
  if (UBEP_SIMGRID) {  // a simulated rank blocks; SimGrid reports a deadlock if every rank does
    UBEP_MPI_CHECK(comms.rank, call, MPI_Wait(&req, MPI_STATUS_IGNORE));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto timeout = options.wait_timeout;
  Backoff backoff(options.poll);
  for (;;) {
    int done = 0;
    UBEP_MPI_CHECK(comms.rank, call, MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (routes.ucx)
      routes.ucx->poll_keeping_errors();  // a peer may wait for this rank's answer before it joins (an error
                                          // there is thrown by this rank's next operation, not by the collective)
    if (gpu.staged) progress_staged();    // ... or for the credits of its staged GPU transfers to this rank
    backoff.pause();
    if ((backoff.polls() & 63) == 0) answer_roll_call(*this);
    if (timeout.count() > 0 && (backoff.polls() & 63) == 0 && std::chrono::steady_clock::now() - start > timeout) {
      broken = true;  // the request stays pending inside MPI; this context cannot run collectives again
      const auto seq = static_cast<std::int64_t>(collective_seq);
      const auto grace = std::min(std::chrono::duration<double>(1.0), timeout * 0.2);
      const std::vector<std::int64_t> at = roll_call(*this, seq, grace);
      std::ostringstream msg, absent, elsewhere;
      int joined = 0;
      for (int pe = 0; pe < comms.size; ++pe) {
        if (at[pe] == seq) ++joined;
        if (at[pe] < 0) absent << " " << pe;
        if (at[pe] >= 0 && at[pe] != seq) elsewhere << "; rank " << pe << " is in collective #" << at[pe];
      }
      msg << what << " did not complete within " << timeout.count() << " s (UBEP_WAIT_TIMEOUT): " << joined << " of "
          << comms.size << " ranks reached it";
      if (!absent.str().empty()) {
        msg << "; not answering from inside a collective within " << grace.count() << " s (dead, stalled, or busy "
            << "outside ubep's collectives): rank" << absent.str();
      }
      msg << elsewhere.str();
      if (absent.str().empty() && elsewhere.str().empty()) {
        msg << "; every rank answered from this collective: MPI did not complete it";
      }
      fail(Errc::timeout, call, msg.str());
    }
  }
}

void State::collective(const char* call, CollKind kind, std::initializer_list<std::int64_t> args,
                       std::initializer_list<const char*> names) {
  const std::vector<std::string> labels(names.begin(), names.end());
  collective(call, kind, std::span<const std::int64_t>(args.begin(), args.size()), labels);
}

void State::collective(const char* call, CollKind kind, std::span<const std::int64_t> args,
                       std::span<const std::string> names) {
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
  if (UBEP_SIMGRID) {
    // A simulated rank blocks anyway (wait_request), and SMPI's non-blocking collectives are linear (the root
    // waits on every rank's message: at 128 ranks SimGrid spent most of the wall time finishing them), while
    // MPI_Allreduce runs its tuned algorithm.
    UBEP_MPI_CHECK(comms.rank, call, MPI_Allreduce(send, recv, 2 * kFields, MPI_INT64_T, MPI_MAX, comms.comm));
  } else {
    UBEP_MPI_CHECK(comms.rank, call, MPI_Iallreduce(send, recv, 2 * kFields, MPI_INT64_T, MPI_MAX, comms.comm, &req));
  }
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
  for (const std::string& name : names) {
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
  for (const std::string& name : names) {
    const int f = static_cast<int>(n + 2);
    if (f >= kFields) break;
    if (lo(f) != hi(f)) msg << "; " << name << " ranges over [" << lo(f) << ", " << hi(f) << "] across ranks";
    ++n;
  }
  fail(Errc::collective_mismatch, call, msg.str());
}

}  // namespace ubep::detail
