// ubep_put_latency: time per blocking put completed remotely, like OSU's osu_put_latency (-w allocate
// -s flush). Rank 0 puts to rank 1; rank 1 only checks the payload. The MPI baselines run in the same
// job on the same ranks: MPI_Put + MPI_Win_flush(1) under MPI_Win_lock_all, on an MPI_Win_allocate window
// (exactly OSU) and on an MPI_Win_create window (the kind ubep's mpi route uses, so that the cost of the
// window kind and the cost of ubep itself can be told apart).
#include "bench/osu_harness.hpp"

int main(int argc, char** argv) {
  using namespace ubep::bench;
  Spec spec{"ubep_put_latency", "ubep put + quiet() latency vs MPI_Put + MPI_Win_flush (OSU osu_put_latency)"};
  spec.memory_option = true;
  return run_benchmark(argc, argv, spec, [](Bench& b) {
    const Settings& s = b.settings();
    const bool origin = b.rank() == 0;
    // One target buffer per route, each in the heap of the Context that reaches rank 1 by that route (the GPU
    // heap under --memory device, with ubep's source there too).
    std::vector<ubep::Symmetric<std::byte>> dst, device_src;
    for (const UbepRoute& r : b.routes()) {
      dst.push_back(b.alloc(*r.ctx, s.max_size));
      if (b.device_memory()) device_src.push_back(b.alloc(*r.ctx, s.max_size));
    }
    Buffer src(s.max_size);
    const auto ubep_src = [&](std::size_t r) { return b.device_memory() ? device_src[r].data() : src.data(); };
    Window allocated(Window::Kind::allocate, s.max_size, b.comm());
    Window created(Window::Kind::create, s.max_size, b.comm());

    std::vector<Column> columns = b.ubep_columns("(us)", "latency_us");
    const std::size_t mpi = columns.size();
    columns.push_back({"MPI(us)", "mpi_rma", "mpi", "latency_us"});
    columns.push_back({"MPI_create(us)", "mpi_rma_create", "mpi", "latency_us"});
    std::vector<Ratio> ratios = b.ubep_ratios(columns, {{"ratio", 0, mpi}, {"ubep/create", 0, mpi + 1}});
    b.start(
        {"rank 0 puts `Size` bytes to rank 1 and waits for remote completion, every iteration:",
         "  ubep:       ctx.put(dst, src, Size, 1); ctx.quiet()",
         "  MPI:        MPI_Put(src, Size, MPI_BYTE, 1, 0, ...); MPI_Win_flush(1, win) on an MPI_Win_allocate "
         "window (OSU)",
         "  MPI_create: the same on an MPI_Win_create window (the window kind of ubep's mpi route)",
         "OSU: MPI is osu_put_latency -w allocate -s flush, MPI_create osu_put_latency -w create -s flush (one-way, "
         "no halving; docs/BENCHMARKS.md says how close they agree)",
         "latency in microseconds per iteration; ratio = ubep / MPI, ubep/create = ubep / MPI_create"},
        columns, ratios);

    std::uint32_t seed = 0;
    for (const std::size_t size : s.sizes()) {
      const int n = static_cast<int>(size);
      // Correctness first: the target's buffer, cleared beforehand, must hold the pattern afterwards.
      for (std::size_t r = 0; r < dst.size(); ++r) {
        ubep::Context& ctx = *b.routes()[r].ctx;
        ++seed;
        if (!origin) b.zero(ctx, dst[r].data(), size);
        b.barrier();
        if (origin) {
          b.fill(ctx, ubep_src(r), size, seed);
          ctx.put(dst[r].data(), ubep_src(r), size, 1);
          ctx.quiet();
        }
        b.barrier();
        bool ok = true;
        if (!origin) {
          ctx.progress();  // MPI_Win_sync on the mpi route: our own view of the heap catches up
          ok = b.check(ctx, dst[r].data(), size, seed, "ubep put");
        }
        b.agree(ok, "ubep put (route " + b.routes()[r].name + ") delivered a wrong payload at size " +
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
          UBEP_BENCH_MPI(MPI_Put(src.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, win->get()));
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
        const auto mpi_put = [&](MPI_Win w) {
          return loop_of([&src, n, w] {
            UBEP_BENCH_MPI(MPI_Put(src.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, w));
            UBEP_BENCH_MPI(MPI_Win_flush(1, w));
          });
        };
        for (std::size_t r = 0; r < dst.size(); ++r) {
          loops[r] = loop_of([&ctx = *b.routes()[r].ctx, d = dst[r].data(), from = ubep_src(r), size] {
            ctx.put(d, from, size, 1);
            ctx.quiet();
          });
        }
        loops[mpi] = mpi_put(allocated.get());
        loops[mpi + 1] = mpi_put(created.get());
      }
      const std::vector<double> t = b.time(size, loops);
      b.row(size, std::vector<std::optional<double>>(t.begin(), t.end()));
    }
  });
}
