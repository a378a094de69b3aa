// ubep_put_bw: unidirectional put bandwidth, like OSU's osu_put_bw (-w allocate -s lock_all): each
// iteration issues a window of 64 non-blocking puts of `Size` bytes to the same target buffer, then
// completes them all. The MPI baselines run in the same job: 64 MPI_Put, then MPI_Win_flush(1), on an
// MPI_Win_allocate window (exactly OSU) and on an MPI_Win_create window (the kind ubep's mpi route uses).
#include "bench/common.hpp"

namespace {
constexpr int kWindow = 64;  // puts in flight per iteration, as OSU's default window size
}

int main(int argc, char** argv) {
  using namespace ubep::bench;
  Spec spec{"ubep_put_bw", "ubep put_nbi x64 + quiet() bandwidth vs 64 MPI_Put + MPI_Win_flush (OSU osu_put_bw)"};
  // One iteration moves 64 x Size bytes: fewer iterations than the latency tests keep the default run short.
  spec.default_iterations = 500;
  spec.default_iterations_large = 20;  // as OSU osu_put_bw
  spec.default_warmup = 50;
  spec.default_warmup_large = 2;
  return run_benchmark(argc, argv, spec, [](Bench& b) {
    ubep::Context& ctx = b.ctx();
    const Settings& s = b.settings();
    const bool origin = b.rank() == 0;
    auto dst = ctx.alloc<std::byte>(s.max_size);
    Buffer src(s.max_size);
    Window allocated(Window::Kind::allocate, s.max_size, b.comm());
    Window created(Window::Kind::create, s.max_size, b.comm());

    b.start({"rank 0 puts `Size` bytes to rank 1, 64 times, then waits for remote completion, every iteration:",
             "  ubep:       64 x ctx.put_nbi(dst, src, Size, 1); ctx.quiet()",
             "  MPI:        64 x MPI_Put(src, Size, MPI_BYTE, 1, 0, ...); MPI_Win_flush(1, win) on an "
             "MPI_Win_allocate window (OSU)",
             "  MPI_create: the same on an MPI_Win_create window (the window kind of ubep's mpi route)",
             "bandwidth in MB/s, 1 MB = 10^6 bytes (as OSU); ratio = ubep / MPI, ubep/create = ubep / MPI_create "
             "(above 1: ubep is faster)"},
            {{"ubep(MB/s)", "ubep", route_name(ctx.route(1)), "bandwidth_mb_s", 2},
             {"MPI(MB/s)", "mpi_rma", "mpi", "bandwidth_mb_s", 2},
             {"MPI_create(MB/s)", "mpi_rma_create", "mpi", "bandwidth_mb_s", 2}},
            {{"ratio", 0, 1}, {"ubep/create", 0, 2}});

    std::uint32_t seed = 0;
    for (const std::size_t size : s.sizes()) {
      const int n = static_cast<int>(size);
      // Correctness first: one full window, then the target checks its buffer.
      ++seed;
      if (!origin) std::memset(dst.data(), 0, size);
      b.barrier();
      if (origin) {
        fill_pattern(src.data(), size, seed);
        for (int i = 0; i < kWindow; ++i) ctx.put_nbi(dst.data(), src.data(), size, 1);
        ctx.quiet();
      }
      b.barrier();
      bool ok = true;
      if (!origin) {
        ctx.progress();
        ok = check_pattern(dst.data(), size, seed, "ubep put_nbi");
      }
      b.agree(ok, "ubep put_nbi delivered a wrong payload at size " + std::to_string(size));
      for (Window* win : {&allocated, &created}) {
        ++seed;
        if (!origin) {
          std::memset(win->base(), 0, size);
          UBEP_BENCH_MPI(MPI_Win_sync(win->get()));
        }
        b.barrier();
        if (origin) {
          fill_pattern(src.data(), size, seed);
          for (int i = 0; i < kWindow; ++i) {
            UBEP_BENCH_MPI(MPI_Put(src.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, win->get()));
          }
          UBEP_BENCH_MPI(MPI_Win_flush(1, win->get()));
        }
        b.barrier();
        if (!origin) {
          UBEP_BENCH_MPI(MPI_Win_sync(win->get()));
          ok = check_pattern(win->base(), size, seed, "MPI_Put");
        }
        b.agree(ok, "MPI_Put delivered a wrong payload at size " + std::to_string(size));
      }

      std::vector<Loop> loops(3, idle_loop());
      if (origin) {
        const auto mpi_window = [&](MPI_Win w) {
          return loop_of([&src, n, w] {
            for (int i = 0; i < kWindow; ++i) UBEP_BENCH_MPI(MPI_Put(src.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, w));
            UBEP_BENCH_MPI(MPI_Win_flush(1, w));
          });
        };
        loops = {loop_of([&] {
                   for (int i = 0; i < kWindow; ++i) ctx.put_nbi(dst.data(), src.data(), size, 1);
                   ctx.quiet();
                 }),
                 mpi_window(allocated.get()), mpi_window(created.get())};
      }
      const std::vector<double> t = b.time(size, loops);
      // The median time gives the median bandwidth; bytes per microsecond = 10^6 bytes per second.
      const auto mb_s = [&](double us) { return static_cast<double>(kWindow) * static_cast<double>(size) / us; };
      b.row(size, {mb_s(t[0]), mb_s(t[1]), mb_s(t[2])});
    }
  });
}
