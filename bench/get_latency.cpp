// ubep_get_latency: time per blocking get, like OSU's osu_get_latency (-w allocate -s flush). Rank 0
// reads from rank 1. The MPI baselines run in the same job: MPI_Get + MPI_Win_flush(1) under
// MPI_Win_lock_all, on an MPI_Win_allocate window (exactly OSU) and on an MPI_Win_create window (the kind
// ubep's mpi route uses). --memory device (OSU's -d cuda): ubep's source and destination in the GPU heap.
#include "bench/osu_harness.hpp"

int main(int argc, char** argv) {
  using namespace ubep::bench;
  Spec spec{"ubep_get_latency", "ubep get latency vs MPI_Get + MPI_Win_flush (OSU osu_get_latency)"};
  spec.memory_option = true;
  return run_benchmark(argc, argv, spec, [](Bench& b) {
    const Settings& s = b.settings();
    const bool origin = b.rank() == 0;
    // One source buffer per route (read on rank 1), each in the heap of the Context of that route (the GPU heap
    // under --memory device, with ubep's destination there too).
    std::vector<ubep::Symmetric<std::byte>> src, device_dst;
    for (const UbepRoute& r : b.routes()) {
      src.push_back(b.alloc(*r.ctx, s.max_size));
      if (b.device_memory()) device_dst.push_back(b.alloc(*r.ctx, s.max_size));
    }
    Buffer dst(s.max_size);
    const auto ubep_dst = [&](std::size_t r) { return b.device_memory() ? device_dst[r].data() : dst.data(); };
    Window allocated(Window::Kind::allocate, s.max_size, b.comm());
    Window created(Window::Kind::create, s.max_size, b.comm());

    std::vector<Column> columns = b.ubep_columns("(us)", "latency_us");
    const std::size_t mpi = columns.size();
    columns.push_back({"MPI(us)", "mpi_rma", "mpi", "latency_us"});
    columns.push_back({"MPI_create(us)", "mpi_rma_create", "mpi", "latency_us"});
    std::vector<Ratio> ratios = b.ubep_ratios(columns, {{"ratio", 0, mpi}, {"ubep/create", 0, mpi + 1}});
    b.start({"rank 0 reads `Size` bytes from rank 1, every iteration:", "  ubep:       ctx.get(dst, src, Size, 1)",
             "  MPI:        MPI_Get(dst, Size, MPI_BYTE, 1, 0, ...); MPI_Win_flush(1, win) on an MPI_Win_allocate "
             "window (OSU)",
             "  MPI_create: the same on an MPI_Win_create window (the window kind of ubep's mpi route)",
             "OSU: MPI is osu_get_latency -w allocate -s flush, MPI_create osu_get_latency -w create -s flush",
             "latency in microseconds per iteration; ratio = ubep / MPI, ubep/create = ubep / MPI_create"},
            columns, ratios);

    std::uint32_t seed = 0;
    for (const std::size_t size : s.sizes()) {
      const int n = static_cast<int>(size);
      // Correctness first: the target publishes a pattern, the origin must read exactly that.
      for (std::size_t r = 0; r < src.size(); ++r) {
        ubep::Context& ctx = *b.routes()[r].ctx;
        ++seed;
        if (!origin) {
          b.fill(ctx, src[r].data(), size, seed);
          ctx.progress();  // MPI_Win_sync on the mpi route: the stores become visible to RMA
        }
        b.barrier();
        bool ok = true;
        if (origin) {
          b.zero(ctx, ubep_dst(r), size);
          ctx.get(ubep_dst(r), src[r].data(), size, 1);
          ok = b.check(ctx, ubep_dst(r), size, seed, "ubep get");
        }
        b.agree(ok,
                "ubep get (route " + b.routes()[r].name + ") returned a wrong payload at size " + std::to_string(size));
      }
      bool ok = true;
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

      std::vector<Loop> loops(columns.size(), idle_loop());
      if (origin) {
        const auto mpi_get = [&](MPI_Win w) {
          return loop_of([&dst, n, w] {
            UBEP_BENCH_MPI(MPI_Get(dst.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, w));
            UBEP_BENCH_MPI(MPI_Win_flush(1, w));
          });
        };
        for (std::size_t r = 0; r < src.size(); ++r) {
          loops[r] = loop_of([&ctx = *b.routes()[r].ctx, from = src[r].data(), to = ubep_dst(r), size] {
            ctx.get(to, from, size, 1);
          });
        }
        loops[mpi] = mpi_get(allocated.get());
        loops[mpi + 1] = mpi_get(created.get());
      }
      const std::vector<double> t = b.time(size, loops);
      b.row(size, std::vector<std::optional<double>>(t.begin(), t.end()));
    }
  });
}
