#include "transports/bounded_call.hpp"

#include <sstream>
#include <utility>

#include "base/poll.hpp"
#include "ubep/error.hpp"

namespace ubep::detail {

struct BoundedCaller::Shared {
  std::atomic<std::uint32_t> posted{0};  // jobs handed to the worker
  std::atomic<std::uint32_t> done{0};    // jobs it finished
  std::atomic<bool> stop{false};
  std::function<void()> job;
  std::exception_ptr error;
  const char* what = "";
  int pe = -1;
  std::uint64_t scratch[8] = {};
};

namespace {
void work(std::shared_ptr<BoundedCaller::Shared> s, PollPolicy poll);
}

BoundedCaller::BoundedCaller(bool bounded, std::chrono::duration<double> timeout, const PollPolicy& poll, int rank)
    : bounded_(bounded && timeout.count() > 0), timeout_(timeout), poll_(poll), rank_(rank) {
  if (!bounded_) return;
  shared_ = std::make_shared<Shared>();
  // Ranks are often bound one per core, so the worker shares the caller's core: the caller yields at
  // once (the worker runs at that yield), and the worker sleeps on a futex right after a brief spin
  // (spinning longer would steal the core from the caller it just answered).
  PollPolicy worker = poll;
  worker.spin = std::min<std::uint32_t>(worker.spin, 32);
  worker.yield = 0;
  poll_.spin = 0;
  worker_ = std::thread(work, shared_, worker);
}

BoundedCaller::~BoundedCaller() {
  if (!worker_.joinable()) return;
  shared_->stop.store(true);
  shared_->posted.fetch_add(1, std::memory_order_release);  // wakes the worker
  shared_->posted.notify_one();
  // A job still inside MPI (its caller timed out) may never return: leave it to the process's end.
  if (shared_->done.load(std::memory_order_acquire) + 1 == shared_->posted.load(std::memory_order_acquire)) {
    worker_.join();
  } else {
    worker_.detach();
  }
}

std::uint64_t* BoundedCaller::scratch() noexcept { return bounded_ ? shared_->scratch : inline_scratch_; }

namespace {
void work(std::shared_ptr<BoundedCaller::Shared> s, PollPolicy poll) {
  std::uint32_t seen = 0;
  for (;;) {
    Backoff backoff(poll);
    while (s->posted.load(std::memory_order_acquire) == seen) {
      if (backoff.polls() < poll.spin + poll.yield) {
        backoff.pause();
      } else {
        s->posted.wait(seen, std::memory_order_acquire);
      }
    }
    if (s->stop.load()) return;
    seen = s->posted.load(std::memory_order_acquire);
    try {
      s->job();
    } catch (...) {
      s->error = std::current_exception();
    }
    s->done.store(seen, std::memory_order_release);
  }
}
}  // namespace

void BoundedCaller::wait_done(const char* what, int pe, bool earlier) {
  const std::uint32_t target = shared_->posted.load(std::memory_order_relaxed);
  if (shared_->done.load(std::memory_order_acquire) == target) return;
  const auto start = std::chrono::steady_clock::now();
  Backoff backoff(poll_);
  while (shared_->done.load(std::memory_order_acquire) != target) {
    backoff.pause();
    if ((backoff.polls() & 15) != 0) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited <= timeout_.count()) continue;
    std::ostringstream msg;
    msg << "ubep: rank " << rank_ << ": ";
    if (earlier) {
      msg << "an earlier " << shared_->what << " to rank " << shared_->pe << " that timed out is still pending after "
          << waited << " more s (UBEP_WAIT_TIMEOUT); " << what << " to rank " << pe << " was not started";
    } else {
      msg << what << " to rank " << pe << " did not complete within " << waited << " s (UBEP_WAIT_TIMEOUT): rank " << pe
          << " is not progressing MPI (stalled, dead, or computing without calling ubep; "
             "UBEP_PROGRESS_THREAD=1 keeps a computing rank progressing)";
    }
    msg << ". The MPI call stays pending; its operation may still complete later";
    throw Error(Errc::timeout, msg.str());
  }
}

void BoundedCaller::run(const char* what, int pe, std::function<void()> fn, bool* started) {
  if (!bounded_) {
    if (started) *started = true;
    return fn();
  }
  wait_done(what, pe, true);  // an earlier call that timed out must finish before the next one starts
  shared_->job = std::move(fn);
  shared_->error = nullptr;
  shared_->what = what;
  shared_->pe = pe;
  if (started) *started = true;
  shared_->posted.fetch_add(1, std::memory_order_release);
  shared_->posted.notify_one();
  wait_done(what, pe, false);
  if (shared_->error) std::rethrow_exception(std::exchange(shared_->error, nullptr));
}

}  // namespace ubep::detail
