// ubep_put_bw: unidirectional put bandwidth, like OSU's osu_put_bw (-w allocate -s flush): each
// iteration issues a window of 64 non-blocking puts of `Size` bytes, message i from offset i * Size of the
// source to offset i * Size of the target (as OSU does: 64 x Size bytes of memory each way), then
// completes them all. The MPI baselines run in the same job: 64 MPI_Put, then MPI_Win_flush(1), on an
// MPI_Win_allocate window (exactly OSU) and on an MPI_Win_create window (the kind ubep's mpi route uses).
#include "bench/osu_harness.hpp"

namespace {
constexpr std::size_t kWindow = 64;  // puts in flight per iteration, as OSU's window (WINDOW_SIZE_LARGE)
}

int main(int argc, char** argv) {
  using namespace ubep::bench;
  Spec spec{"ubep_put_bw", "ubep put_nbi x64 + quiet() bandwidth vs 64 MPI_Put + MPI_Win_flush (OSU osu_put_bw)"};
  // One iteration moves 64 x Size bytes: fewer iterations than the latency tests keep the default run short.
  spec.default_iterations = 500;
  spec.default_iterations_large = 20;  // as OSU osu_put_bw
  spec.default_warmup = 50;
  spec.default_warmup_large = 2;
  spec.memory_option = true;
  // Every buffer holds a window of messages: 64 x 1 MiB (UBEP_HEAP_SIZE must hold 64 x --max-size).
  spec.default_max_size = std::size_t{1} << 20;
  return run_benchmark(argc, argv, spec, [](Bench& b) {
    const Settings& s = b.settings();
    const bool origin = b.rank() == 0;
    // One target buffer per route, each in the heap of the Context that reaches rank 1 by that route (the GPU
    // heap under --memory device, with ubep's source there too).
    std::vector<ubep::Symmetric<std::byte>> dst, device_src;
    const std::size_t span = kWindow * s.max_size;
    for (const UbepRoute& r : b.routes()) {
      dst.push_back(b.alloc(*r.ctx, span));
      if (b.device_memory()) device_src.push_back(b.alloc(*r.ctx, span));
    }
    Buffer src(span);
    const auto ubep_src = [&](std::size_t r) { return b.device_memory() ? device_src[r].data() : src.data(); };
    Window allocated(Window::Kind::allocate, span, b.comm());
    Window created(Window::Kind::create, span, b.comm());

    std::vector<Column> columns = b.ubep_columns("(MB/s)", "bandwidth_mb_s", 2);
    const std::size_t mpi = columns.size();
    columns.push_back({"MPI(MB/s)", "mpi_rma", "mpi", "bandwidth_mb_s", 2});
    columns.push_back({"MPI_create(MB/s)", "mpi_rma_create", "mpi", "bandwidth_mb_s", 2});
    std::vector<Ratio> ratios = b.ubep_ratios(columns, {{"ratio", 0, mpi}, {"ubep/create", 0, mpi + 1}});
    b.start({"rank 0 puts `Size` bytes to rank 1, 64 times, then waits for remote completion, every iteration:",
             "  ubep:       for i < 64: ctx.put_nbi(dst + i * Size, src + i * Size, Size, 1); then ctx.quiet()",
             "  MPI:        for i < 64: MPI_Put(src + i * Size, Size, MPI_BYTE, 1, i * Size, ...); then "
             "MPI_Win_flush(1, win), on an MPI_Win_allocate window",
             "  MPI_create: the same on an MPI_Win_create window (the window kind of ubep's mpi route)",
             "OSU: MPI is osu_put_bw -w allocate -s flush (window size 64, as OSU 5.6 and later; older OSU "
             "versions put 32 per window)",
             "bandwidth in MB/s, 1 MB = 10^6 bytes (as OSU); ratio = ubep / MPI, ubep/create = ubep / MPI_create "
             "(above 1: ubep is faster)"},
            columns, ratios);

    std::uint32_t seed = 0;
    for (const std::size_t size : s.sizes()) {
      const int n = static_cast<int>(size);
      const std::size_t all = kWindow * size;  // the window's bytes, message i at offset i * size
      // Correctness first: one full window, then the target checks every message of it.
      for (std::size_t r = 0; r < dst.size(); ++r) {
        ubep::Context& ctx = *b.routes()[r].ctx;
        ++seed;
        if (!origin) b.zero(ctx, dst[r].data(), all);
        b.barrier();
        if (origin) {
          b.fill(ctx, ubep_src(r), all, seed);
          for (std::size_t i = 0; i < kWindow; ++i)
            ctx.put_nbi(dst[r].data() + i * size, ubep_src(r) + i * size, size, 1);
          ctx.quiet();
        }
        b.barrier();
        bool ok = true;
        if (!origin) {
          ctx.progress();
          ok = b.check(ctx, dst[r].data(), all, seed, "ubep put_nbi");
        }
        b.agree(ok, "ubep put_nbi (route " + b.routes()[r].name + ") delivered a wrong payload at size " +
                        std::to_string(size));
      }
      bool ok = true;
      for (Window* win : {&allocated, &created}) {
        ++seed;
        if (!origin) {
          std::memset(win->base(), 0, all);
          UBEP_BENCH_MPI(MPI_Win_sync(win->get()));
        }
        b.barrier();
        if (origin) {
          fill_pattern(src.data(), all, seed);
          for (std::size_t i = 0; i < kWindow; ++i) {
            UBEP_BENCH_MPI(MPI_Put(src.data() + i * size, n, MPI_BYTE, 1, static_cast<MPI_Aint>(i * size), n, MPI_BYTE,
                                   win->get()));
          }
          UBEP_BENCH_MPI(MPI_Win_flush(1, win->get()));
        }
        b.barrier();
        if (!origin) {
          UBEP_BENCH_MPI(MPI_Win_sync(win->get()));
          ok = check_pattern(win->base(), all, seed, "MPI_Put");
        }
        b.agree(ok, "MPI_Put delivered a wrong payload at size " + std::to_string(size));
      }

      std::vector<Loop> loops(columns.size(), idle_loop());
      if (origin) {
        const auto mpi_window = [&](MPI_Win w) {
          return loop_of([&src, n, size, w] {
            for (std::size_t i = 0; i < kWindow; ++i) {
              UBEP_BENCH_MPI(
                  MPI_Put(src.data() + i * size, n, MPI_BYTE, 1, static_cast<MPI_Aint>(i * size), n, MPI_BYTE, w));
            }
            UBEP_BENCH_MPI(MPI_Win_flush(1, w));
          });
        };
        for (std::size_t r = 0; r < dst.size(); ++r) {
          loops[r] = loop_of([&ctx = *b.routes()[r].ctx, d = dst[r].data(), from = ubep_src(r), size] {
            for (std::size_t i = 0; i < kWindow; ++i) ctx.put_nbi(d + i * size, from + i * size, size, 1);
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
