// The back-off of every wait: spin with a pause, then yield the core, then sleep in doubling steps.
// Oversubscribed runs (4 ranks on 2 cores) stay fast because a waiting rank gives its core away.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "ubep/options.hpp"

namespace ubep::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class Backoff {
 public:
  explicit Backoff(const PollPolicy& policy) : policy_(policy) {}
  /// One step of waiting. Returns true when it is time to call into MPI: every `progress_every` polls
  /// while spinning, and on every poll once yielding or sleeping (a poll is then long anyway, and an
  /// MPI that progresses only inside calls would otherwise wait for us).
  bool pause() {
    ++polls_;
    if (polls_ <= policy_.spin) {
      cpu_relax();
      return polls_ % policy_.progress_every == 0;
    }
    if (polls_ - policy_.spin <= policy_.yield) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
      sleep_us_ = std::min<std::uint32_t>(sleep_us_ * 2, std::max<std::uint32_t>(policy_.sleep_max_us, 1));
    }
    return true;
  }
  std::uint64_t polls() const { return polls_; }

 private:
  const PollPolicy& policy_;
  std::uint64_t polls_ = 0;
  std::uint32_t sleep_us_ = 1;
};

}  // namespace ubep::detail
