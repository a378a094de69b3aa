/// \file osu_timing.cpp
/// The timing of the OSU-style harness (osu_harness.hpp): Bench::time's interleaved batches, and the barrier,
/// agreement and waits that keep every ubep Context progressing while they block.
#include <sched.h>

#include <algorithm>
#include <chrono>

#include "base/poll.hpp"
#include "bench/osu_harness.hpp"
#include "ubep/config.hpp"

namespace ubep::bench {

std::vector<double> Bench::time(std::size_t size, const std::vector<Loop>& loops) const {
  const std::uint64_t iterations = settings_.iterations_for(size);
  const std::uint64_t batches =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(static_cast<std::uint64_t>(settings_.batches), iterations));
  const std::uint64_t warmup = settings_.warmup_for(size);
  for (const Loop& l : loops) {
    barrier();
    l(warmup);
  }
  // The other loops' batches ran in between and took the caches (at 64 KiB put_bw moves 4 MiB per
  // iteration and a batch holds 2): each batch starts warm again, as OSU's one loop is after its skip
  // (with 1 iteration put_bw at 64 KiB still measured 21 GB/s where OSU's one loop gives 33, with 2: 31).
  const std::uint64_t rewarm = warmup == 0 ? 0 : std::max<std::uint64_t>(2, warmup / batches);
  std::vector<std::vector<double>> per_iteration(loops.size());
  for (std::uint64_t b = 0; b < batches; ++b) {
    // Spread the remainder so that the batches add up to exactly `iterations`.
    const std::uint64_t n = iterations / batches + (b < iterations % batches ? 1 : 0);
    for (std::size_t i = 0; i < loops.size(); ++i) {
      barrier();
      loops[i](rewarm);
      const auto t0 = Clock::now();
      loops[i](n);
      const auto t1 = Clock::now();
      per_iteration[i].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(n));
    }
  }
  barrier();
  std::vector<double> out;
  for (auto& v : per_iteration) out.push_back(median(std::move(v)));
  return out;
}

void Bench::progress_all() const {
  for (ubep::Context* c : contexts_) c->progress();
}

void Bench::wait(MPI_Request& request) const {
#if UBEP_SIMGRID
  // A simulated rank that polls costs wall time for every poll (smpi/test each) and, at hundreds of ranks,
  // hours: it issues its own deferred signals once, then blocks. In simulation no peer needs this rank's
  // progress for its own to complete (signals are messages, which wait in MPI until applied; puts land
  // without the target).
  progress_all();
  UBEP_BENCH_MPI(MPI_Wait(&request, MPI_STATUS_IGNORE));
  return;
#endif
  const std::uint32_t spin = contexts_.front()->options().poll.spin;
  for (std::uint64_t polls = 0;; ++polls) {
    int done = 0;
    UBEP_BENCH_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    progress_all();
    if (spin_only_ || polls < spin) {
      ubep::detail::cpu_relax();
    } else {
      sched_yield();
    }
  }
}

void Bench::barrier() const {
#if UBEP_SIMGRID  // blocking, as in wait(); SMPI's MPI_Ibarrier is linear, its MPI_Barrier is not
  progress_all();
  UBEP_BENCH_MPI(MPI_Barrier(comm_));
#else
  MPI_Request request = MPI_REQUEST_NULL;
  UBEP_BENCH_MPI(MPI_Ibarrier(comm_, &request));
  wait(request);
#endif
}

void Bench::agree(bool ok, const std::string& what) const {
  int all = ok ? 1 : 0;
#if UBEP_SIMGRID
  progress_all();
  UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_));
#else
  MPI_Request request = MPI_REQUEST_NULL;
  UBEP_BENCH_MPI(MPI_Iallreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_, &request));
  wait(request);
#endif
  if (!all) throw CheckFailed(what);
}

}  // namespace ubep::bench
