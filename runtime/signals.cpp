// Signals: put_signal, signal_op and the waits. See DESIGN.md "Operations and their completion".
#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>

#include "base/mpi_check.hpp"
#include "base/poll.hpp"
#include "runtime/state.hpp"

namespace ubep {

using detail::State;

namespace detail {
namespace {
std::uint64_t load(const std::uint64_t* sig) {
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(sig)).load(std::memory_order_acquire);
}

}  // namespace

void State::issue_pending_signals() {
  // One flush per peer with data in flight makes every put remotely complete; then the signals go out
  // without further flushes (accumulates from one origin are ordered by MPI's default
  // accumulate_ordering, so earlier signals need no flush).
  std::atomic_thread_fence(std::memory_order_seq_cst);  // shm data before MPI signals (mixed routes)
  routes.mpi->flush_data();
  // A signal leaves the list as it is issued: one whose MPI call times out stays pending inside MPI and still
  // completes there, so a later delivery must not issue it again (nor those before it); the ones after it stay.
  std::size_t issued = 0;
  try {
    for (; issued < in_flight.signals.size(); ++issued) {
      const PendingSignal p = in_flight.signals[issued];
      const std::uint64_t before = routes.mpi->updates_issued();
      try {
        atomics_of(p.pe).post_signal(atomic_of(p.op), p.offset, p.value, p.pe);
      } catch (...) {
        if (routes.mpi->updates_issued() != before) ++issued;  // handed to MPI before the error: it happens
        throw;
      }
    }
  } catch (...) {
    in_flight.signals.erase(in_flight.signals.begin(), in_flight.signals.begin() + static_cast<std::ptrdiff_t>(issued));
    throw;
  }
  in_flight.signals.clear();
}

void State::progress() {
  flush_pending_signals();
  if (gpu.staged) progress_staged();
  if (routes.ucx) routes.ucx->poll();
  if (routes.mpi) routes.mpi->progress(comms.comm);
  if (gpu.window) gpu.window->progress(comms.comm);
}

void State::apply_sent_signal_messages(const char* call) {
  if (!routes.mpi || !routes.mpi->signal_messages()) return;
  const std::vector<std::uint64_t>& sent = routes.mpi->messages_sent();
  std::uint64_t expected = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  if (UBEP_SIMGRID) {  // blocking, as every simulated wait (SMPI's non-blocking collectives are linear)
    UBEP_MPI_CHECK(comms.rank, call,
                   MPI_Reduce_scatter_block(sent.data(), &expected, 1, MPI_UINT64_T, MPI_SUM, comms.signal_comm));
  } else {
    UBEP_MPI_CHECK(
        comms.rank, call,
        MPI_Ireduce_scatter_block(sent.data(), &expected, 1, MPI_UINT64_T, MPI_SUM, comms.signal_comm, &req));
  }
  wait_request(call, req, "the count of signal messages sent to each rank");
  const auto start = std::chrono::steady_clock::now();
  Backoff backoff(options.poll);
  while (routes.mpi->messages_applied() < expected) {
    if (routes.mpi->deliver(UBEP_SIMGRID != 0) == 0) backoff.pause();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (routes.mpi->messages_applied() < expected && options.wait_timeout.count() > 0 &&
        waited > options.wait_timeout.count()) {
      fail(Errc::timeout, call,
           "waited " + std::to_string(waited) + " s for the signal messages the peers sent before this " +
               std::string(call) + ": " + std::to_string(routes.mpi->messages_applied()) + " of " +
               std::to_string(expected) + " applied");
    }
  }
}

void State::quiet() {
  flush_pending_signals();
  complete_device("quiet");
  routes.load_store->flush_all();
  if (routes.ucx) routes.ucx->flush_all();
  if (routes.mpi) routes.mpi->flush_all();
  // Every atomic of this rank is complete: a later one of another kind on the same word cannot overlap them.
  in_flight.atomic_family.clear();
}

namespace {

/// The condition of signal i: one value for all, or one per signal.
struct Targets {
  std::uint64_t one = 0;
  std::span<const std::uint64_t> per;
  std::uint64_t at(std::size_t i) const { return per.empty() ? one : per[i]; }
  /// Left out of the wait (kSignalIgnored, per-signal values only).
  bool ignored(std::size_t i) const { return !per.empty() && per[i] == kSignalIgnored; }
  std::size_t awaited(std::size_t n) const {
    return per.empty() ? n : n - static_cast<std::size_t>(std::count(per.begin(), per.end(), kSignalIgnored));
  }
};

enum class Mode { all, any, some };

void check_signals(const State& s, const char* call, std::span<const std::uint64_t> sigs, const Targets& t,
                   const WaitOptions& opts) {
  s.check_alive(call);
  if (!t.per.empty() && t.per.size() != sigs.size()) {
    s.fail(Errc::invalid_argument, call,
           std::to_string(t.per.size()) + " values given for " + std::to_string(sigs.size()) + " signals");
  }
  if (!opts.writers.empty() && opts.writers.size() != 1 && opts.writers.size() != sigs.size()) {
    s.fail(Errc::invalid_argument, call,
           std::to_string(opts.writers.size()) + " writers given for " + std::to_string(sigs.size()) + " signals");
  }
  for (std::size_t i = 0; i < opts.writers.size(); ++i) {
    const int w = opts.writers[i];
    if (w < -1 || w >= s.comms.size) {
      s.fail(Errc::out_of_range, call,
             "WaitOptions::writers[" + std::to_string(i) + "] = " + std::to_string(w) + " is not a rank in [0, " +
                 std::to_string(s.comms.size) + ") (or -1 for unknown)");
    }
  }
  if (!sigs.empty()) s.check_range(call, sigs.data(), sigs.size_bytes());
  if (reinterpret_cast<std::uintptr_t>(sigs.data()) % 8 != 0) s.check_word(call, sigs.data());
}

[[noreturn]] void timeout_report(const State& s, const char* call, std::span<const std::uint64_t> sigs, Cmp cmp,
                                 const Targets& t, const WaitOptions& opts, double seconds, Mode mode) {
  std::ostringstream msg;
  msg << "timeout after " << seconds << " s (UBEP_WAIT_TIMEOUT or WaitOptions::timeout)";
  if (opts.what) msg << " waiting for " << opts.what;
  msg << "; condition: " << (mode == Mode::all ? "all of" : "any of") << " " << t.awaited(sigs.size()) << " signal(s) ";
  std::size_t shown = 0, unsatisfied = 0;
  std::vector<int> missing;
  for (std::size_t i = 0; i < sigs.size(); ++i) {
    const std::uint64_t v = load(&sigs[i]);
    if (t.ignored(i) || compare(v, cmp, t.at(i))) continue;
    ++unsatisfied;
    int writer = -1;
    if (opts.writers.size() == 1) writer = opts.writers[0];
    if (opts.writers.size() == sigs.size()) writer = opts.writers[i];
    if (writer >= 0 && std::find(missing.begin(), missing.end(), writer) == missing.end()) missing.push_back(writer);
    if (shown++ < 16) {
      msg << "\n  signal[" << i << "] (rank " << s.comms.rank << ", heap offset "
          << (reinterpret_cast<const char*>(&sigs[i]) - s.heap.base) << ") = " << v << ", waiting for "
          << to_string(cmp) << " " << t.at(i);
      if (writer >= 0) msg << ", expected writer: rank " << writer;
    }
  }
  if (shown > 16) msg << "\n  ... and " << (shown - 16) << " more";
  msg << "\n  " << unsatisfied << " of " << t.awaited(sigs.size()) << " unsatisfied";
  if (!missing.empty()) {
    msg << "; peers that have not written: rank";
    for (int w : missing) msg << " " << w;
  } else if (opts.writers.empty()) {
    msg << "; writers unknown (pass WaitOptions::writers to name them)";
  }
  s.fail(Errc::timeout, call, msg.str());
}

/// The indices of the signals whose condition holds, into `out` (cleared first: a wait polls with one
/// vector, allocating nothing after its first poll).
void satisfied(std::span<const std::uint64_t> sigs, Cmp cmp, const Targets& t, std::vector<std::size_t>& out) {
  out.clear();
  for (std::size_t i = 0; i < sigs.size(); ++i) {
    if (!t.ignored(i) && compare(load(&sigs[i]), cmp, t.at(i))) out.push_back(i);
  }
}
std::vector<std::size_t> satisfied(std::span<const std::uint64_t> sigs, Cmp cmp, const Targets& t) {
  std::vector<std::size_t> out;
  satisfied(sigs, cmp, t, out);
  return out;
}

/// The polling loop behind every wait, once the condition did not hold at once: polls `ready()` until it
/// holds, progressing whatever can deliver a signal (signal messages, the ucx worker, staged chunks, MPI)
/// and backing off per UBEP_POLL; past the deadline calls `expired(waited seconds)`, which throws.
template <class Ready, class Expired>
void poll_until(State& s, const char* call, const WaitOptions& opts, Ready&& ready, Expired&& expired) {
  const double timeout = (opts.timeout ? *opts.timeout : s.options.wait_timeout).count();
  // The clock starts at the first deadline check (the 16th poll), not here: a clock read (24 ns on a VM)
  // at the call delayed the return after a quick signal (+10 ns per one-way trip of a load/store
  // ping-pong, measured), though it ran before the signal arrived.
  std::chrono::steady_clock::time_point start{};
  Backoff backoff(s.options.poll);
  const bool messages = s.routes.mpi && s.routes.mpi->signal_messages();
  std::uint64_t turns = 0;  // every 16th turn checks the deadline, whatever arrived (a busy peer cannot delay it)
  for (;;) {
    if (ready()) {
      if (s.routes.uses_mpi) UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_sync(s.heap.world_win));
      return;
    }
    // Signals as messages: each one applied may be what this wait needs (look again at once, without a
    // pause). In SimGrid builds the rank blocks until one arrives (a poll would never yield to the
    // simulation; SimGrid reports a deadlock when every rank blocks): no deadline there.
    const bool delivered = messages && s.routes.mpi->deliver(UBEP_SIMGRID != 0) > 0;
    // The peers' ucx messages land only while this rank progresses its worker; one that landed may be what this
    // wait needs (look again at once).
    const bool landed = !delivered && s.routes.ucx && s.routes.ucx->poll();
    if (!delivered) {
      if (s.gpu.staged) s.progress_staged();  // staged GPU chunks from other nodes land as this rank drains them
      if (!landed && backoff.pause()) {
        if (s.routes.mpi && !messages) s.routes.mpi->progress(s.comms.comm);  // messages: deliver() progressed
        if (s.gpu.window) s.gpu.window->progress(s.comms.comm);               // peers' RMA on the GPU heap's window
      }
    }
    if (timeout > 0 && (++turns & 15) == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (start == std::chrono::steady_clock::time_point{}) start = now;
      const double waited = std::chrono::duration<double>(now - start).count();
      if (waited > timeout) expired(waited);
    }
  }
}

/// The wait behind every wait_until_*. Returns the satisfied indices (all of them for Mode::all).
std::vector<std::size_t> wait_impl(State& s, const char* call, std::span<const std::uint64_t> sigs, Cmp cmp,
                                   const Targets& t, const WaitOptions& opts, Mode mode) {
  check_signals(s, call, sigs, t, opts);
  const std::size_t awaited = t.awaited(sigs.size());
  const auto ready = [&](std::vector<std::size_t>& out) {
    satisfied(sigs, cmp, t, out);
    return mode == Mode::all ? out.size() == awaited : !out.empty();
  };
  std::vector<std::size_t> out;
  if (awaited == 0) {
    if (mode == Mode::all) return out;
    s.fail(Errc::invalid_argument, call,
           "waiting for any of an empty set of signals (or all kSignalIgnored) would never return");
  }
  // Our own deferred signals may be what a peer waits for before answering; they go out even when the
  // condition already holds (the promise is "by the next wait", and a rank that then computes would
  // starve its peer).
  s.flush_pending_signals();
  if (ready(out)) {
    if (s.routes.uses_mpi) UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_sync(s.heap.world_win));
    return out;
  }
  poll_until(
      s, call, opts, [&] { return ready(out); },
      [&](double waited) { timeout_report(s, call, sigs, cmp, t, opts, waited, mode); });
  return out;
}

}  // namespace

void State::check_wait(const char* call, std::span<const std::uint64_t> sigs, const WaitOptions& opts) const {
  check_signals(*this, call, sigs, Targets{0, {}}, opts);
}

void State::put_signal_checked(std::size_t off, const void* src, std::size_t bytes, std::size_t soff,
                               std::uint64_t value, SignalOp op, int pe, bool blocking) {
  if (char* m = routes.mapped_signals[pe]) {  // self, shm with load/store signals: a copy and one release store
    put_signal_mapped(m, off, src, bytes, soff, value, op);  // complete on return, nbi too
    return;
  }
  Transport& data = data_route(pe);
  Transport& at = atomics_of(pe);
  if (&data == &at && data.put_with_signal(off, src, bytes, atomic_of(op), soff, value, pe, blocking)) {
    return;  // ucx: one message; nbi: `src` locally complete at quiet() or flush(pe)
  }
  if (bytes) data.put_nbi(off, src, bytes, pe);
  if (!blocking) {
    if (&at != routes.mpi.get()) {  // only MPI signals are deferred (see issue_pending_signals)
      at.post_signal(atomic_of(op), soff, value, pe);
    } else {
      in_flight.signals.push_back({soff, value, op, pe});
    }
    return;
  }
  if (&data != &at) std::atomic_thread_fence(std::memory_order_seq_cst);  // shm data, MPI signal
  flush_pending_signals();                                                // keep signals to one word in program order
  // post_signal flushes the peer first when data is in flight, which also completes the put locally.
  at.post_signal(atomic_of(op), soff, value, pe);
}

void State::signal_checked(std::size_t soff, std::uint64_t value, SignalOp op, int pe, bool after_every_put) {
  // Ordered after this rank's puts to every peer (after_every_put; context.hpp, signal_op): UCX orders only the
  // stream to one peer, so the data still in flight to the other ucx peers is flushed first (one round trip for
  // all of them). Not for a signal to this rank itself: its own word, which it observes itself, after its own
  // puts to itself (complete on return, or earlier in its ucx stream to itself).
  const bool order = after_every_put && routes.ucx && pe != comms.rank;
  if (char* m = routes.mapped_signals[pe]; m != nullptr && !order) {
    apply_posted(m, soff, atomic_of(op), value);
    return;
  }
  Transport& at = atomics_of(pe);
  if (order) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // shm data before a UCX signal
    routes.ucx->order_before_signal(pe);
    if (char* m = routes.mapped_signals[pe]) {
      apply_posted(m, soff, atomic_of(op), value);
      return;
    }
  }
  if (&at != routes.mpi.get()) {  // only MPI signals are deferred (see issue_pending_signals)
    at.post_signal(atomic_of(op), soff, value, pe);
  } else {
    in_flight.signals.push_back({soff, value, op, pe});
  }
}

}  // namespace detail

using detail::Mode;
using detail::Targets;

namespace detail {
namespace {
/// put_signal (`blocking`) and put_signal_nbi past the load/store fast path: every check in order (the
/// error names the first bad argument), device data first, then the routes. Out of line, so that the fast
/// path stays a leaf without this path's stack frame.
[[gnu::noinline]] void put_signal_full(State& s, const char* call, void* dest, const void* src, std::size_t bytes,
                                       std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe, bool blocking) {
  s.check_alive(call);
  s.check_pe(call, pe);
  const bool on_device = bytes && s.device_holds(dest);
  const std::size_t off = bytes && !on_device ? s.check_range(call, dest, bytes) : 0;
  const std::size_t soff = s.check_word(call, sig);
  s.complete_device(call);  // device data issued before goes before the signal
  if (on_device) {          // the copy complete, then the signal alone (as bytes 0)
    s.device_put(call, dest, src, bytes, pe, true);
    bytes = 0;
  }
  s.put_signal_checked(off, src, bytes, soff, value, op, pe, blocking);
}

/// The load/store fast path of put_signal and put_signal_nbi (complete on return, for both): the same checks
/// of the two ranges, a copy and one release store or add. False when pe is not such a peer (or the context
/// is finalized, device copies are pending, `dest` is in the GPU heap): then put_signal_full runs.
inline bool put_signal_mapped(State& s, const char* call, void* dest, const void* src, std::size_t bytes,
                              std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe) {
  char* m = s.mapped_signal_target(pe, dest, bytes);
  if (m == nullptr) return false;
  const std::size_t off = bytes ? s.check_range(call, dest, bytes) : 0;
  State::put_signal_mapped(m, off, src, bytes, s.check_word(call, sig), value, op);
  return true;
}
}  // namespace
}  // namespace detail

void Context::put_signal(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value,
                         SignalOp op, int pe) {
  State& s = *state_;
  if (!detail::put_signal_mapped(s, "put_signal", dest, src, bytes, sig, value, op, pe)) {
    detail::put_signal_full(s, "put_signal", dest, src, bytes, sig, value, op, pe, true);
  }
}

void Context::put_signal_nbi(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value,
                             SignalOp op, int pe) {
  State& s = *state_;
  if (!detail::put_signal_mapped(s, "put_signal_nbi", dest, src, bytes, sig, value, op, pe)) {
    detail::put_signal_full(s, "put_signal_nbi", dest, src, bytes, sig, value, op, pe, false);
  }
}

void Context::signal_op(std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe) {
  State& s = *state_;
  s.check_alive("signal_op");
  s.check_pe("signal_op", pe);
  const std::size_t soff = s.check_word("signal_op", sig);
  s.complete_device("signal_op");
  s.signal_checked(soff, value, op, pe);
}

std::uint64_t Context::signal_fetch(const std::uint64_t* sig) const {
  state_->check_alive("signal_fetch");
  state_->check_word("signal_fetch", sig);
  return detail::load(sig);
}

std::uint64_t Context::wait_until(const std::uint64_t* sig, Cmp cmp, std::uint64_t value, const WaitOptions& opts) {
  std::span<const std::uint64_t> one(sig, 1);
  state_->check_alive("wait_until");
  state_->check_word("wait_until", sig);
  State& s = *state_;
  s.flush_pending_signals();
  std::uint64_t v = detail::load(sig);
  if (compare(v, cmp, value)) {  // no allocation, no clock
    if (s.routes.uses_mpi) UBEP_MPI_CHECK(s.comms.rank, "wait_until", MPI_Win_sync(s.heap.world_win));
    return v;
  }
  // One word: polled as one load, without wait_impl's vector of satisfied indices, whose allocation and
  // release would sit between the signal's arrival and this call's return.
  const Targets target{value, {}};
  detail::check_signals(s, "wait_until", one, target, opts);
  detail::poll_until(
      s, "wait_until", opts,
      [&] {
        v = detail::load(sig);
        return compare(v, cmp, value);
      },
      [&](double waited) { detail::timeout_report(s, "wait_until", one, cmp, target, opts, waited, Mode::all); });
  return v;
}

void Context::wait_until_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value,
                             const WaitOptions& opts) {
  detail::wait_impl(*state_, "wait_until_all", sigs, cmp, Targets{value, {}}, opts, Mode::all);
}

void Context::wait_until_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::span<const std::uint64_t> values,
                             const WaitOptions& opts) {
  detail::wait_impl(*state_, "wait_until_all", sigs, cmp, Targets{0, values}, opts, Mode::all);
}

std::size_t Context::wait_until_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value,
                                    const WaitOptions& opts) {
  return detail::wait_impl(*state_, "wait_until_any", sigs, cmp, Targets{value, {}}, opts, Mode::any).front();
}

std::size_t Context::wait_until_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::span<const std::uint64_t> values,
                                    const WaitOptions& opts) {
  return detail::wait_impl(*state_, "wait_until_any", sigs, cmp, Targets{0, values}, opts, Mode::any).front();
}

std::vector<std::size_t> Context::wait_until_some(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value,
                                                  const WaitOptions& opts) {
  return detail::wait_impl(*state_, "wait_until_some", sigs, cmp, Targets{value, {}}, opts, Mode::some);
}

std::vector<std::size_t> Context::wait_until_some(std::span<const std::uint64_t> sigs, Cmp cmp,
                                                  std::span<const std::uint64_t> values, const WaitOptions& opts) {
  return detail::wait_impl(*state_, "wait_until_some", sigs, cmp, Targets{0, values}, opts, Mode::some);
}

bool Context::test(const std::uint64_t* sig, Cmp cmp, std::uint64_t value) {
  state_->check_alive("test");
  state_->check_word("test", sig);
  state_->progress();
  return compare(detail::load(sig), cmp, value);
}

bool Context::test_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value) {
  detail::check_signals(*state_, "test_all", sigs, Targets{value, {}}, {});
  state_->progress();
  return detail::satisfied(sigs, cmp, Targets{value, {}}).size() == sigs.size();
}

std::optional<std::size_t> Context::test_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value) {
  detail::check_signals(*state_, "test_any", sigs, Targets{value, {}}, {});
  state_->progress();
  auto s = detail::satisfied(sigs, cmp, Targets{value, {}});
  if (s.empty()) return std::nullopt;
  return s.front();
}

std::vector<std::size_t> Context::test_some(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value) {
  detail::check_signals(*state_, "test_some", sigs, Targets{value, {}}, {});
  state_->progress();
  return detail::satisfied(sigs, cmp, Targets{value, {}});
}

void Context::progress() {
  state_->check_alive("progress");
  state_->progress();
}

}  // namespace ubep
