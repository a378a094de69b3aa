// ubep_get_latency: time per blocking get, like OSU's osu_get_latency (-w allocate -s lock_all). Rank 0
// reads from rank 1. The MPI baselines run in the same job: MPI_Get + MPI_Win_flush(1) under
// MPI_Win_lock_all, on an MPI_Win_allocate window (exactly OSU) and on an MPI_Win_create window (the kind
// ubep's mpi route uses).
#include "bench/common.hpp"

int main(int argc, char** argv) {
  using namespace ubep::bench;
  Spec spec{"ubep_get_latency", "ubep get latency vs MPI_Get + MPI_Win_flush (OSU osu_get_latency)"};
  return run_benchmark(argc, argv, spec, [](Bench& b) {
    ubep::Context& ctx = b.ctx();
    const Settings& s = b.settings();
    const bool origin = b.rank() == 0;
    auto src = ctx.alloc<std::byte>(s.max_size);  // read on rank 1
    Buffer dst(s.max_size);
    Window allocated(Window::Kind::allocate, s.max_size, b.comm());
    Window created(Window::Kind::create, s.max_size, b.comm());

    b.start({"rank 0 reads `Size` bytes from rank 1, every iteration:", "  ubep:       ctx.get(dst, src, Size, 1)",
             "  MPI:        MPI_Get(dst, Size, MPI_BYTE, 1, 0, ...); MPI_Win_flush(1, win) on an MPI_Win_allocate "
             "window (OSU)",
             "  MPI_create: the same on an MPI_Win_create window (the window kind of ubep's mpi route)",
             "latency in microseconds per iteration; ratio = ubep / MPI, ubep/create = ubep / MPI_create"},
            {{"ubep(us)", "ubep", route_name(ctx.route(1)), "latency_us"},
             {"MPI(us)", "mpi_rma", "mpi", "latency_us"},
             {"MPI_create(us)", "mpi_rma_create", "mpi", "latency_us"}},
            {{"ratio", 0, 1}, {"ubep/create", 0, 2}});

    std::uint32_t seed = 0;
    for (const std::size_t size : s.sizes()) {
      const int n = static_cast<int>(size);
      // Correctness first: the target publishes a pattern, the origin must read exactly that.
      ++seed;
      if (!origin) {
        fill_pattern(src.data(), size, seed);
        ctx.progress();  // MPI_Win_sync on the mpi route: the stores become visible to RMA
      }
      b.barrier();
      bool ok = true;
      if (origin) {
        std::memset(dst.data(), 0, size);
        ctx.get(dst.data(), src.data(), size, 1);
        ok = check_pattern(dst.data(), size, seed, "ubep get");
      }
      b.agree(ok, "ubep get returned a wrong payload at size " + std::to_string(size));
      for (Window* win : {&allocated, &created}) {
        ++seed;
        if (!origin) {
          fill_pattern(win->base(), size, seed);
          UBEP_BENCH_MPI(MPI_Win_sync(win->get()));
        }
        b.barrier();
        if (origin) {
          std::memset(dst.data(), 0, size);
          UBEP_BENCH_MPI(MPI_Get(dst.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, win->get()));
          UBEP_BENCH_MPI(MPI_Win_flush(1, win->get()));
          ok = check_pattern(dst.data(), size, seed, "MPI_Get");
        }
        b.agree(ok, "MPI_Get returned a wrong payload at size " + std::to_string(size));
      }

      std::vector<Loop> loops(3, idle_loop());
      if (origin) {
        const auto mpi_get = [&](MPI_Win w) {
          return loop_of([&dst, n, w] {
            UBEP_BENCH_MPI(MPI_Get(dst.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, w));
            UBEP_BENCH_MPI(MPI_Win_flush(1, w));
          });
        };
        loops = {loop_of([&] { ctx.get(dst.data(), src.data(), size, 1); }), mpi_get(allocated.get()),
                 mpi_get(created.get())};
      }
      const std::vector<double> t = b.time(size, loops);
      b.row(size, {t[0], t[1], t[2]});
    }
  });
}
