// ubep_compute_progress: what a long expert compute costs with and without UBEP_PROGRESS_THREAD.
// Rank 1 runs a fixed amount of arithmetic (no ubep call in between, like an expert kernel); at its
// start rank 0 sends it one put_signal of --bytes bytes, and rank 1 waits for the signal after its
// compute. Both are timed twice in one job, on one Context without a progress thread and one with it
// (the same settings otherwise):
//   compute_ms       rank 1's compute (the progress thread takes CPU from it: the cost)
//   put_signal_ms    rank 0's put_signal: on routes that need the target's CPU (ucx in am mode, mpi over
//                    TCP) a rendezvous completes only when the target progresses (the benefit)
//   wait_ms          rank 1's wait_until after its compute (the data already there, or still to move)
// Each row is the median over --repeats runs. The data is checked (a wrong byte fails the run, exit 1).
// Run across nodes, e.g. bash tests/multinode/emulate.sh --nodes 2 --ranks-per-node 1 --
// build/bench/ubep_compute_progress; with 2 ranks on one node the route is shm (nothing to progress).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "ubep/ubep.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  double compute_ms = 0, put_signal_ms = 0, wait_ms = 0;
};

/// One run per repeat on `ctx`: returns rank 0's put_signal time and rank 1's compute and wait times
/// (every rank gets all three, through an allreduce). Throws on wrong data.
Row measure(ubep::Context& ctx, std::size_t bytes, std::uint64_t work, int repeats) {
  auto buf = ctx.alloc<unsigned char>(bytes);
  auto sig = ctx.alloc_signals(1);
  std::vector<unsigned char> src(bytes);
  std::vector<double> compute, put, wait;
  for (int r = 1; r <= repeats; ++r) {
    for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 31 + r);
    ctx.barrier();
    double times[3] = {0, 0, 0};
    if (ctx.rank() == 0) {
      const auto t0 = Clock::now();
      ctx.put_signal(buf.data(), src.data(), bytes, sig.data(), static_cast<std::uint64_t>(r), ubep::SignalOp::set, 1);
      times[1] = ms_since(t0);
    } else if (ctx.rank() == 1) {
      const auto t0 = Clock::now();
      volatile std::uint64_t x = 1;  // the expert: dependent arithmetic, no memory traffic, no ubep call
      for (std::uint64_t i = 0; i < work; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      times[0] = ms_since(t0);
      const auto t1 = Clock::now();
      ctx.wait_until(sig.data(), ubep::Cmp::ge, static_cast<std::uint64_t>(r));
      times[2] = ms_since(t1);
      for (std::size_t i = 0; i < bytes; ++i) {
        if (buf[i] != static_cast<unsigned char>(i * 31 + r)) {
          throw std::runtime_error("rank 1: byte " + std::to_string(i) + " of repeat " + std::to_string(r) +
                                   " is wrong");
        }
      }
    }
    // Rank 0 waits here in ubep's back-off, not in a busy-polling MPI call that would take the CPU the
    // compute and the progress threads share on a small machine.
    ctx.barrier();
    ubep::check_mpi(MPI_Allreduce(MPI_IN_PLACE, times, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), ctx.rank(),
                    "ubep_compute_progress", "MPI_Allreduce");
    compute.push_back(times[0]);
    put.push_back(times[1]);
    wait.push_back(times[2]);
  }
  ctx.barrier();
  return {median(compute), median(put), median(wait)};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CLI::App app{"ubep_compute_progress: a long compute with and without UBEP_PROGRESS_THREAD (2 ranks)"};
  std::size_t bytes = std::size_t{1} << 20;
  double compute_ms = 1000;
  int repeats = 3;
  app.add_option("--bytes", bytes, "bytes of the put_signal that rank 0 sends while rank 1 computes")
      ->capture_default_str();
  app.add_option("--compute-ms", compute_ms, "about how long rank 1 computes, in ms (calibrated once)")
      ->capture_default_str();
  app.add_option("--repeats", repeats, "runs per setting; the median is printed")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  int rc = 0;
  try {
    if (size != 2) throw std::runtime_error("run with exactly 2 ranks (got " + std::to_string(size) + ")");
    if (provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error("MPI_THREAD_MULTIPLE is needed for the progress thread");
    // Calibrate the work on rank 1 (the same count for both settings), shared with rank 0.
    std::uint64_t work = 0;
    if (rank == 1) {
      const std::uint64_t probe = 20'000'000;
      const auto t0 = Clock::now();
      volatile std::uint64_t x = 1;
      for (std::uint64_t i = 0; i < probe; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      work = static_cast<std::uint64_t>(static_cast<double>(probe) * compute_ms / std::max(ms_since(t0), 1e-3));
    }
    ubep::check_mpi(MPI_Bcast(&work, 1, MPI_UINT64_T, 1, MPI_COMM_WORLD), rank, "ubep_compute_progress", "MPI_Bcast");
    ubep::Options base = ubep::Options::from_env();
    std::vector<Row> rows;
    std::string route;
    // UBEP_PROGRESS_THREAD=0, auto (the default: the ucx route's own thread) and 1 (MPI, UCX and the staged route).
    const char* const names[] = {"0 (off)", "auto", "1 (full)"};
    for (int mode = 0; mode < 3; ++mode) {
      ubep::Options o = base;
      o.progress_thread = mode == 2   ? ubep::ProgressThread::on
                          : mode == 1 ? ubep::ProgressThread::automatic
                                      : ubep::ProgressThread::off;
      ubep::Context ctx(MPI_COMM_WORLD, o);
      route = ubep::to_string(ctx.route(1 - rank));
      rows.push_back(measure(ctx, bytes, work, repeats));
      ctx.finalize();
    }
    if (rank == 0) {
      std::printf(
          "# ubep_compute_progress: rank 1 computes about %.0f ms (no ubep call) while rank 0 sends it one "
          "%zu-byte put_signal\n# route between the ranks: %s; medians of %d runs; ms\n",
          compute_ms, bytes, route.c_str(), repeats);
      std::printf("%-22s %12s %14s %10s\n", "UBEP_PROGRESS_THREAD", "compute_ms", "put_signal_ms", "wait_ms");
      for (std::size_t i = 0; i < rows.size(); ++i) {
        std::printf("%-22s %12.1f %14.3f %10.3f\n", names[i], rows[i].compute_ms, rows[i].put_signal_ms,
                    rows[i].wait_ms);
      }
      std::printf("# compute with the thread / without: auto %.3f, 1 %.3f\n", rows[1].compute_ms / rows[0].compute_ms,
                  rows[2].compute_ms / rows[0].compute_ms);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep_compute_progress: rank %d: error: %s\n", rank, e.what());
    rc = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
