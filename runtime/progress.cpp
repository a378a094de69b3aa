// The progress thread beside the caller's (UBEP_PROGRESS_THREAD): the full one (MPI, UCX and the staged GPU
// route on a timer) or the ucx route's own (asleep on the worker's event fd); started by the last phase of
// Context(), stopped before teardown and by ~Context.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "base/mpi_check.hpp"
#include "runtime/state.hpp"
#include "ubep/config.hpp"
#if UBEP_HAVE_UCX
#include "transports/ucx/ucx_transport.hpp"
#endif

namespace ubep::detail {

// Phase 11 of Context(): the progress thread the options ask for, if any.
void start_progress(State& s, const char* call) {
  if (s.options.progress_thread == ProgressThread::on) {
    if (s.comms.thread_level != MPI_THREAD_MULTIPLE) {
      s.fail(Errc::unsupported, call,
             "UBEP_PROGRESS_THREAD=1 needs MPI_THREAD_MULTIPLE (MPI was initialized with a lower level)");
    }
    UBEP_MPI_CHECK(s.comms.rank, call, MPI_Comm_dup(s.comms.comm, &s.comms.progress_comm));
    const auto interval = std::chrono::microseconds(s.options.progress_interval_us);
    s.progress_thread.thread = std::thread([&s, interval] {
      while (!s.progress_thread.stop.load(std::memory_order_relaxed)) {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, s.comms.progress_comm, &flag, MPI_STATUS_IGNORE);
        if (s.routes.ucx) s.routes.ucx->poll_keeping_errors();  // messages aimed at this rank land while it computes
        s.thread_progress_staged();  // staged GPU chunks land, credits and get replies go out
        std::this_thread::sleep_for(interval);
      }
    });
    s.progress_thread.kind = "full: MPI, UCX and the staged GPU route every " +
                             std::to_string(s.options.progress_interval_us) + " us (UBEP_PROGRESS_THREAD=1)";
  }
#if UBEP_HAVE_UCX
  else if (s.routes.ucx && s.options.progress_thread != ProgressThread::off) {
    // The ucx route's thread: asleep on the worker's event fd until a message arrives for this rank, then it
    // runs the handlers and sends the answers (and moves the staged GPU route on), so peers' quiet(), gets and
    // atomics complete while this rank computes or sits in a plain MPI call. It calls no MPI.
    s.progress_thread.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s.progress_thread.wake_fd < 0) {
      s.fail(Errc::internal, call, std::string("eventfd for the progress thread: ") + std::strerror(errno));
    }
    auto* u = static_cast<detail::UcxTransport*>(s.routes.ucx.get());
    s.progress_thread.thread = std::thread([&s, u] {
      // While the application progresses the worker itself (it waits, tests, polls in ubep), the thread keeps away:
      // waking on every message and taking the worker's lock from a spinning waiter doubled the one-way latency
      // across two emulated nodes, and even a look every 200 us cost 40 % there (2 cores). So it looks after kMinUs,
      // then after twice as long each time the application was still there, up to kMaxUs. Once the application has
      // not progressed for one such interval, the thread serves the worker until the application is back: first by
      // polling it (every kPollUs, doubling to kMaxPollUs), and after kArmUs away asleep on the worker's event fd
      // (ucp_worker_arm), so an idle job burns no core. Arming is kept for long absences because every ping-pong
      // after an arm ran 1.3-1.9x slower across two emulated nodes (UCX 1.13, TCP).
      constexpr long kMinUs = 200, kMaxUs = 10000, kPollUs = 50, kMaxPollUs = 2000, kArmUs = 1000000;
      pollfd stop_fd{s.progress_thread.wake_fd, POLLIN, 0};
      pollfd fds[2] = {{u->event_fd(), POLLIN, 0}, stop_fd};
      const auto nap = [&](long us) {
        timespec t{us / 1000000, (us % 1000000) * 1000};
        (void)::ppoll(&stop_fd, 1, &t, nullptr);
      };
      long away_us = kMinUs;
      while (!s.progress_thread.stop.load(std::memory_order_relaxed)) {
        const std::uint64_t seen = u->app_polls();
        nap(away_us);
        if (u->app_polls() != seen) {  // the application is in ubep
          away_us = std::min(away_us * 2, kMaxUs);
          continue;
        }
        away_us = kMinUs;
        long poll_us = kPollUs, served_us = 0;
        while (!s.progress_thread.stop.load(std::memory_order_relaxed) && u->app_polls() == seen) {
          u->thread_pass();
          s.thread_progress_staged();
          if (served_us < kArmUs) {
            nap(poll_us);
            served_us += poll_us;
            poll_us = std::min(poll_us * 2, kMaxPollUs);
            continue;
          }
          if (!u->arm()) continue;  // something arrived during the pass: another pass first
          // Local work in flight (a rendezvous, sends): look again soon even if no event says so.
          (void)::poll(fds, 2, u->busy() ? 1 : 1000);
        }
      }
    });
    s.progress_thread.kind =
        "ucx: serves the UCX worker while the application is away from ubep (polls it, then sleeps on its event fd; "
        "UBEP_PROGRESS_THREAD=auto)";
  }
#endif
}

void State::stop_progress_thread() noexcept {
  progress_thread.stop = true;
  if (progress_thread.wake_fd >= 0) {
    const std::uint64_t one = 1;
    (void)!::write(progress_thread.wake_fd, &one, sizeof one);  // the ucx thread sleeps in poll(): wake it
  }
  if (progress_thread.thread.joinable()) progress_thread.thread.join();
  if (progress_thread.wake_fd >= 0) ::close(progress_thread.wake_fd);
  progress_thread.wake_fd = -1;
}

}  // namespace ubep::detail
