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
    const Settings& s = b.settings();
    const bool origin = b.rank() == 0;
    // One target buffer per route, each in the heap of the Context that reaches rank 1 by that route.
    std::vector<ubep::Symmetric<std::byte>> dst;
    for (const UbepRoute& r : b.routes()) dst.push_back(r.ctx->alloc<std::byte>(s.max_size));
    Buffer src(s.max_size);
    Window allocated(Window::Kind::allocate, s.max_size, b.comm());
    Window created(Window::Kind::create, s.max_size, b.comm());

    std::vector<Column> columns = b.ubep_columns("(MB/s)", "bandwidth_mb_s", 2);
    const std::size_t mpi = columns.size();
    columns.push_back({"MPI(MB/s)", "mpi_rma", "mpi", "bandwidth_mb_s", 2});
    columns.push_back({"MPI_create(MB/s)", "mpi_rma_create", "mpi", "bandwidth_mb_s", 2});
    std::vector<Ratio> ratios = b.ubep_ratios(columns, {{"ratio", 0, mpi}, {"ubep/create", 0, mpi + 1}});
    b.start({"rank 0 puts `Size` bytes to rank 1, 64 times, then waits for remote completion, every iteration:",
             "  ubep:       64 x ctx.put_nbi(dst, src, Size, 1); ctx.quiet()",
             "  MPI:        64 x MPI_Put(src, Size, MPI_BYTE, 1, 0, ...); MPI_Win_flush(1, win) on an "
             "MPI_Win_allocate window (OSU)",
             "  MPI_create: the same on an MPI_Win_create window (the window kind of ubep's mpi route)",
             "OSU: MPI corresponds to osu_put_bw -w allocate -s flush, which puts its window of messages to "
             "distinct offsets (this benchmark: the same buffer each time, so at 4 KiB and up the target stays in "
             "cache and the values are higher than OSU's)",
             "bandwidth in MB/s, 1 MB = 10^6 bytes (as OSU); ratio = ubep / MPI, ubep/create = ubep / MPI_create "
             "(above 1: ubep is faster)"},
            columns, ratios);

    std::uint32_t seed = 0;
    for (const std::size_t size : s.sizes()) {
      const int n = static_cast<int>(size);
      // Correctness first: one full window, then the target checks its buffer.
      for (std::size_t r = 0; r < dst.size(); ++r) {
        ubep::Context& ctx = *b.routes()[r].ctx;
        ++seed;
        if (!origin) std::memset(dst[r].data(), 0, size);
        b.barrier();
        if (origin) {
          fill_pattern(src.data(), size, seed);
          for (int i = 0; i < kWindow; ++i) ctx.put_nbi(dst[r].data(), src.data(), size, 1);
          ctx.quiet();
        }
        b.barrier();
        bool ok = true;
        if (!origin) {
          ctx.progress();
          ok = check_pattern(dst[r].data(), size, seed, "ubep put_nbi");
        }
        b.agree(ok, "ubep put_nbi (route " + b.routes()[r].name + ") delivered a wrong payload at size " +
                        std::to_string(size));
      }
      bool ok = true;
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

      std::vector<Loop> loops(columns.size(), idle_loop());
      if (origin) {
        const auto mpi_window = [&](MPI_Win w) {
          return loop_of([&src, n, w] {
            for (int i = 0; i < kWindow; ++i) UBEP_BENCH_MPI(MPI_Put(src.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, w));
            UBEP_BENCH_MPI(MPI_Win_flush(1, w));
          });
        };
        for (std::size_t r = 0; r < dst.size(); ++r) {
          loops[r] = loop_of([&ctx = *b.routes()[r].ctx, d = dst[r].data(), &src, size] {
            for (int i = 0; i < kWindow; ++i) ctx.put_nbi(d, src.data(), size, 1);
            ctx.quiet();
          });
        }
        loops[mpi] = mpi_window(allocated.get());
        loops[mpi + 1] = mpi_window(created.get());
      }
      const std::vector<double> t = b.time(size, loops);
      // The median time gives the median bandwidth; bytes per microsecond = 10^6 bytes per second.
      std::vector<std::optional<double>> mb_s;
      for (const double us : t) mb_s.push_back(static_cast<double>(kWindow) * static_cast<double>(size) / us);
      b.row(size, mb_s);
    }
  });
}
