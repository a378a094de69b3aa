/// \file osu_harness.hpp
/// The OSU-style harness, what every OSU-style ubep benchmark shares: the command line, MPI and Context
/// set-up, timing in batches with a median, the correctness checks, and the output (OSU text table, CSV,
/// JSON). Sources: osu_harness.cpp (the Bench, its columns and output), osu_timing.cpp (timed loops, waits),
/// osu_buffers.cpp (buffers, windows, patterns), osu_run.cpp (run_benchmark, the command line).
///
/// A benchmark is a function `void body(Bench&)` handed to run_benchmark(), which initializes MPI,
/// parses the flags, creates the ubep::Context, prints the header from rank 0, and turns every
/// failure into a non-zero exit code: a wrong payload (CheckFailed, on every rank) ends the job
/// cleanly with exit code 1; any other exception on one rank aborts the job, because its peer may be
/// blocked in a ping-pong it can never finish.
///
/// Routes: when the peer is off this node (its route is mpi or ucx) and the build has UCX, run_benchmark
/// also creates a second Context on the same communicator that reaches the peer by the other off-node
/// route (the same Options, UBEP_TRANSPORTS forced to self,shm,<other route>), and every body times ubep
/// once per entry of Bench::routes(), beside the same baselines (`--routes default` keeps the default
/// route only). On the node there is one route, the default.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/binding.hpp"
#include "ubep/config.hpp"
#include "ubep/context.hpp"
#include "ubep/symmetric.hpp"

namespace ubep::bench {

/// The benchmarks' clock: steady_clock, and in SimGrid builds the simulated time (MPI_Wtime), which is
/// what a simulated run measures.
#if UBEP_SIMGRID
struct Clock {
  using rep = double;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<double>;
  using time_point = std::chrono::time_point<Clock, duration>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(duration(MPI_Wtime())); }
};
#else
using Clock = std::chrono::steady_clock;
#endif

/// Throws ubep::Error(Errc::mpi) ("ubep: rank R: baseline: <call> failed: <MPI's error string>", see
/// ubep::throw_mpi_error) when an MPI call of a baseline fails.
/// The baselines' communicators and windows use MPI_ERRORS_RETURN so that failures come back here.
#define UBEP_BENCH_MPI(call)                                                           \
  do {                                                                                 \
    const int ubep_bench_rc_ = (call);                                                 \
    if (ubep_bench_rc_ != MPI_SUCCESS) ::ubep::bench::mpi_fail(ubep_bench_rc_, #call); \
  } while (0)

[[noreturn]] void mpi_fail(int code, const char* call);

/// A correctness check failed. Thrown on every rank at once (see agree()), so the job ends cleanly.
class CheckFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The flags shared by all benchmarks (see --help).
struct Settings {
  std::size_t min_size = 1;
  std::size_t max_size = std::size_t{4} << 20;
  /// Timed iterations per size: `iterations` below `large_size`, `iterations_large` from it on.
  std::uint64_t iterations = 10000;
  std::uint64_t iterations_large = 1000;
  std::uint64_t warmup = 1000;
  std::uint64_t warmup_large = 100;
  std::size_t large_size = 8192;
  /// The timed iterations of one size run in this many batches; the reported value is the median batch.
  int batches = 10;
  bool csv = false;
  /// --routes all (default): off the node, ubep over both off-node routes (see Bench::routes()); false:
  /// the default route only.
  bool all_routes = true;
  /// Empty: no JSON. "-": JSON on stdout instead of the table. Otherwise a file name.
  std::optional<std::string> json;
  /// --bind auto (default) or none, and what run_benchmark did with it (bind_ranks, before the Context).
  std::string bind = "auto";
  Binding binding;
  /// The MPI thread level in force and the --mpi-thread that asked for it, for the header.
  std::string mpi_thread;
  /// --memory (benchmarks whose Spec::memory_option is set): "host" (default) or "device": ubep's buffers in
  /// the GPU heap (Context::alloc_device), as OSU's -d cuda. The MPI baselines stay in host memory.
  std::string memory = "host";

  std::uint64_t iterations_for(std::size_t size) const { return size >= large_size ? iterations_large : iterations; }
  std::uint64_t warmup_for(std::size_t size) const { return size >= large_size ? warmup_large : warmup; }
  /// min_size, then doubling up to max_size (0 is followed by 1).
  std::vector<std::size_t> sizes() const;
};

/// One implementation's timed loop: `loop(n)` runs n iterations. Type-erased per batch, never per
/// iteration, so that the 10 ns steps of the fastest baselines stay inlined.
using Loop = std::function<void(std::uint64_t n)>;
template <class Step>
Loop loop_of(Step step) {
  return [step](std::uint64_t n) mutable {
    for (std::uint64_t i = 0; i < n; ++i) step();
  };
}
/// A loop for a rank that does not take part in the timed steps (the target of a put).
inline Loop idle_loop() {
  return [](std::uint64_t) {};
}

/// One column of values: its title in the table, and the (impl, route, metric) of its JSON records.
struct Column {
  std::string title;   ///< e.g. "ubep(us)"
  std::string impl;    ///< e.g. "ubep", "mpi_rma"
  std::string route;   ///< e.g. "shm", "mpi"
  std::string metric;  ///< the JSON key of the value, e.g. "latency_us"
  int precision = 3;   ///< decimals in the table
};
/// A ratio column: values[numerator] / values[denominator].
struct Ratio {
  std::string title;
  std::size_t numerator;
  std::size_t denominator;
};

/// One route ubep is timed over: its name and a Context that reaches the peer (rank 1 from rank 0) by it.
struct UbepRoute {
  std::string name;         ///< "self", "shm", "mpi" or "ucx": ctx->route(peer)
  ubep::Context* ctx;       ///< Bench::ctx() for the default route, otherwise the second Context
  bool is_default = false;  ///< the route of Bench::ctx() (the environment's UBEP_TRANSPORTS)
};

/// Everything a benchmark body needs.
class Bench {
 public:
  /// `contexts`: the default Context first, then at most one more that reaches the peer by the other
  /// off-node route; `routes_note` says why there is one route only (empty when there are two).
  Bench(std::string name, std::string description, const Settings& settings, std::vector<ubep::Context*> contexts,
        std::string routes_note);
  ~Bench();
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  /// The default Context (from the environment); the baselines take their poll policy from it.
  ubep::Context& ctx() { return *contexts_.front(); }
  /// The routes to time ubep over, in Route order (mpi before ucx): one, the default route, unless the
  /// peer is off the node, the build has UCX and --routes is all; then mpi and ucx, each with its Context.
  /// Every body allocates its ubep buffers on each route's Context and times one loop per route.
  const std::vector<UbepRoute>& routes() const { return routes_; }
  /// A private duplicate of ctx.comm() for the baselines (MPI_ERRORS_RETURN), so that their traffic and
  /// barriers never mix with ubep's own collectives.
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  const Settings& settings() const { return settings_; }

  /// The value columns of ubep, one per entry of routes(), in that order, impl "ubep", their route's name,
  /// `metric`: titled "ubep" + unit ("ubep(us)") with one route, "ubep_<route>" + unit ("ubep_ucx(us)")
  /// with several. They come first in the columns of start() and in every row.
  std::vector<Column> ubep_columns(const std::string& unit, const std::string& metric, int precision = 3) const;
  /// The ratio columns of the ubep columns. `ratios` are written for one route (numerator 0, denominators
  /// indices into `columns`, which start with ubep_columns()): with one route they are returned as they
  /// are; with several, each route gets the first of them only, titled "ubep_<route>/<baseline>" (the
  /// denominator's title without its unit), so that the table stays readable. The JSON has every value.
  std::vector<Ratio> ubep_ratios(const std::vector<Column>& columns, const std::vector<Ratio>& ratios) const;

  /// Rank 0 prints the header (name, versions, routes, settings, iteration counts, column titles).
  /// `notes` are extra "# " lines (what is measured, units).
  void start(const std::vector<std::string>& notes, std::vector<Column> columns, std::vector<Ratio> ratios);
  /// Rank 0 prints one row and keeps its JSON records; nullopt prints "n/a" (JSON: null, "available": false).
  /// Only rank 0's values are used.
  void row(std::size_t size, const std::vector<std::optional<double>>& values);
  /// Rank 0 writes the JSON (if asked). Call once, after the last row.
  void finish();

  /// Times every loop at `size`: warm-up iterations, then the timed ones in Settings::batches batches.
  /// The batches alternate between the loops (batch 1 of each loop, then batch 2, ...), with a barrier
  /// before each, so that a slow phase of a noisy machine hits every implementation alike and the ratios
  /// of one row stay meaningful. Returns per loop the median over batches of the time per iteration, in
  /// microseconds (meaningful on the rank that drives the steps). Every rank passes as many loops, in the
  /// same order.
  std::vector<double> time(std::size_t size, const std::vector<Loop>& loops) const;

  /// --memory device: ubep's buffers are in the GPU heap.
  bool device_memory() const { return settings_.memory == "device"; }
  /// An ubep buffer of `bytes` on `ctx`, per --memory: ctx.alloc or ctx.alloc_device (collective).
  ubep::Symmetric<std::byte> alloc(ubep::Context& ctx, std::size_t bytes) const;
  /// fill_pattern, zeroing and check_pattern on an ubep buffer of `ctx` (from alloc()): directly in host
  /// memory, through a host copy (ctx.put / ctx.get to this rank) in the GPU heap.
  void fill(ubep::Context& ctx, std::byte* dst, std::size_t bytes, std::uint32_t seed) const;
  void zero(ubep::Context& ctx, std::byte* dst, std::size_t bytes) const;
  bool check(ubep::Context& ctx, const std::byte* src, std::size_t bytes, std::uint32_t seed, const char* what) const;

  /// A barrier on comm() that keeps every ubep Context progressing while it waits (see wait()).
  void barrier() const;
  /// All ranks learn whether every rank's `ok` holds; throws CheckFailed(what) on every rank otherwise.
  /// Progresses every ubep Context while it waits, like barrier().
  void agree(bool ok, const std::string& what) const;

 private:
  /// Waits for `request` while progressing every ubep Context: on the ucx route a put, get or quiet aimed
  /// at this rank completes only while this rank runs ubep code, so a plain blocking MPI call here would
  /// stall the peer's timed loop. Polls with a pause, then yields (never, with spin_only_); never sleeps,
  /// as MPI's own blocking calls do not, so that the target answers at once.
  void wait(MPI_Request& request) const;
  /// One progress call on every Context (issues the deferred signals of the mpi route).
  void progress_all() const;

  std::string name_;
  std::string description_;
  Settings settings_;
  std::vector<ubep::Context*> contexts_;
  std::vector<UbepRoute> routes_;
  std::string routes_note_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  /// wait() never yields: the ranks own their cores (--bind) and no progress thread shares the core. Open
  /// MPI's blocking calls spin the same way unless oversubscribed, and a target that yields answers Open
  /// MPI's osc ucx puts on an MPI_Win_create window late (0.8 instead of 0.43 us at 8 B here).
  bool spin_only_ = false;
  std::vector<Column> columns_;
  std::vector<Ratio> ratios_;
  struct Json;
  std::unique_ptr<Json> json_;
};

/// What run_benchmark needs to know about one benchmark.
struct Spec {
  std::string name;         ///< "ubep_put_latency"
  std::string description;  ///< one line for --help
  std::size_t default_min_size = 1;
  std::size_t default_max_size = std::size_t{4} << 20;
  /// Default counts (see Settings). With --iterations N alone, the large count becomes
  /// min(default_iterations_large, N); the same for --warmup.
  std::uint64_t default_iterations = 10000;
  std::uint64_t default_iterations_large = 1000;
  std::uint64_t default_warmup = 1000;
  std::uint64_t default_warmup_large = 100;
  /// Offers --memory host|device (Settings::memory).
  bool memory_option = false;
};

/// Initializes MPI (MPI_THREAD_MULTIPLE, so UBEP_PROGRESS_THREAD works), parses the flags, builds the
/// Context (and the second one of the other off-node route, see Bench::routes()) and a Bench, runs `body`
/// on every rank, finalizes. Returns the process exit code.
int run_benchmark(int argc, char** argv, const Spec& spec, const std::function<void(Bench&)>& body);

// ---- helpers for the bodies ----------------------------------------------------------------------------

/// A page-aligned local buffer (OSU aligns its buffers the same way).
class Buffer {
 public:
  explicit Buffer(std::size_t bytes);
  std::byte* data() const { return ptr_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte, Free> ptr_;
};

/// A baseline MPI window of `bytes` bytes per rank (at least 64), zeroed, MPI_ERRORS_RETURN, and locked
/// with MPI_Win_lock_all for its whole life. Collective to create and to destroy.
class Window {
 public:
  /// allocate: MPI_Win_allocate (what OSU uses); create: MPI_Win_create over a page-aligned buffer (the
  /// kind of window ubep's mpi route uses); allocate_shared: MPI_Win_allocate_shared (one node only).
  enum class Kind { allocate, create, allocate_shared };
  Window(Kind kind, std::size_t bytes, MPI_Comm comm);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
  MPI_Win get() const { return win_; }
  /// This rank's part of the window.
  std::byte* base() const { return static_cast<std::byte*>(base_); }
  /// Kind::allocate_shared only: where `rank`'s part is mapped in this process.
  std::byte* peer_base(int rank) const;

 private:
  MPI_Win win_ = MPI_WIN_NULL;
  void* base_ = nullptr;
  std::unique_ptr<Buffer> memory_;      // Kind::create only
  std::vector<std::byte*> peer_bases_;  // SimGrid builds, Kind::allocate_shared: every rank's base here
};

/// Fills `bytes` bytes with a pattern that differs per seed and per offset, so that a stale buffer, a
/// shifted copy or a truncated one is caught.
void fill_pattern(void* dst, std::size_t bytes, std::uint32_t seed);
/// True when `bytes` bytes at `src` hold fill_pattern(seed); otherwise prints the first bad offset.
bool check_pattern(const void* src, std::size_t bytes, std::uint32_t seed, const char* what);

/// Median of a non-empty vector.
double median(std::vector<double> v);

/// The name of Route r ("self", "shm", "mpi", "ucx").
std::string route_name(ubep::Route r);

/// `parts` with `sep` between them.
std::string join(const std::vector<std::string>& parts, const char* sep);

}  // namespace ubep::bench
