/// \file osu_run.cpp
/// run_benchmark, the main of every OSU-style benchmark (osu_harness.hpp): the MPI thread level, the command
/// line, the default Context and the second one of the other off-node route, and the exit code.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <span>

#include "bench/osu_harness.hpp"
#include "ubep/config.hpp"

namespace ubep::bench {

namespace {

/// Parses a size with an optional K/M/G suffix (powers of 2), like UBEP_HEAP_SIZE.
std::size_t size_arg(const std::string& text, const char* flag) {
  try {
    return ubep::parse_size(text, flag);
  } catch (const std::exception& e) {
    throw CLI::ValidationError(flag, e.what());
  }
}

/// What run_benchmark learns about the second Context: its Options when there is one, else why not.
struct OtherRoute {
  std::optional<ubep::Options> options;
  ubep::Route route = ubep::Route::mpi;
  std::string why_not;
};

/// The other off-node route to the peer (rank 1 - rank): ucx when the default route is mpi, mpi when it is
/// ucx, and the Options that force it (the default's, with UBEP_TRANSPORTS=self,shm,<route>). Only when
/// the peer is off this node (real or UBEP_VIRTUAL_NODES nodes: on the node both Contexts would take shm),
/// the build has UCX, and --routes is all.
OtherRoute other_route(const ubep::Context& ctx, bool all_routes) {
  constexpr bool kHaveUcx = UBEP_HAVE_UCX;
  const int peer = 1 - ctx.rank();
  const ubep::Route route = ctx.route(peer);
  const std::span<const int> node = ctx.node_ranks();
  OtherRoute out;
  if (!all_routes) {
    out.why_not = "--routes default";
  } else if (std::find(node.begin(), node.end(), peer) != node.end()) {
    out.why_not = "the peer shares this node";
  } else if (route != ubep::Route::mpi && route != ubep::Route::ucx) {
    out.why_not = "the peer is off the node, but reached by " + route_name(route);
  } else if (!kHaveUcx) {
    out.why_not = "this build has no UCX";
  } else {
    out.route = route == ubep::Route::mpi ? ubep::Route::ucx : ubep::Route::mpi;
    out.options = ctx.options();
    out.options->transports = {"self", "shm", route_name(out.route)};
  }
  return out;
}

/// The second Context, or nullptr; collective over the world. Throws when the ranks disagree (they would
/// not create it together) or when it does not reach the peer by the route it was made for.
std::unique_ptr<ubep::Context> other_context(const OtherRoute& other) {
  int want[2] = {other.options ? 1 : 0, other.options ? -1 : 0};  // max and -min in one reduction
  UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, want, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (want[0] != -want[1])
    throw std::runtime_error("the ranks disagree on whether the peer is off the node (a second route)");
  if (!other.options) return nullptr;
  auto ctx = std::make_unique<ubep::Context>(MPI_COMM_WORLD, *other.options);
  const ubep::Route got = ctx->route(1 - ctx->rank());
  if (got != other.route) {
    throw std::runtime_error("the second Context, UBEP_TRANSPORTS=" + join(other.options->transports, ",") +
                             ", reaches the peer by " + route_name(got) + ", not by " + route_name(other.route));
  }
  return ctx;
}

}  // namespace

namespace {

struct ThreadLevel {
  const char* flag;
  const char* name;
  int value;
};
constexpr ThreadLevel kThreadLevels[] = {{"single", "MPI_THREAD_SINGLE", MPI_THREAD_SINGLE},
                                         {"funneled", "MPI_THREAD_FUNNELED", MPI_THREAD_FUNNELED},
                                         {"serialized", "MPI_THREAD_SERIALIZED", MPI_THREAD_SERIALIZED},
                                         {"multiple", "MPI_THREAD_MULTIPLE", MPI_THREAD_MULTIPLE}};

std::string thread_level_name(int level) {
  for (const ThreadLevel& t : kThreadLevels) {
    if (t.value == level) return t.name;
  }
  return "unknown";
}

/// The value of --mpi-thread, read before MPI_Init (CLI11 parses after it, and also checks the value).
std::string thread_flag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mpi-thread" && i + 1 < argc) return argv[i + 1];
    if (a.rfind("--mpi-thread=", 0) == 0) return a.substr(13);
  }
  return "auto";
}

}  // namespace

int run_benchmark(int argc, char** argv, const Spec& spec, const std::function<void(Bench&)>& body) {
  // auto: the level OSU's benchmarks run at (MPI_Init: no thread support is asked for, so MPI takes no
  // locks), unless ubep needs MPI_THREAD_MULTIPLE for UBEP_PROGRESS_THREAD.
  std::string thread = thread_flag(argc, argv);
  int requested =
      ubep::Options::from_env().progress_thread == ubep::ProgressThread::on ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE;
  for (const ThreadLevel& t : kThreadLevels) {
    if (thread == t.flag) requested = t.value;
  }
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, requested, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "%s: MPI_Init_thread failed\n", spec.name.c_str());
    return 2;
  }
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);

  Settings s;
  s.min_size = spec.default_min_size;
  s.max_size = spec.default_max_size;
  s.iterations = spec.default_iterations;
  s.iterations_large = spec.default_iterations_large;
  s.warmup = spec.default_warmup;
  s.warmup_large = spec.default_warmup_large;
  std::string min_text = std::to_string(s.min_size), max_text = std::to_string(s.max_size);
  std::string json_path;
  CLI::App app{spec.name + ": " + spec.description +
               "\nRun with exactly 2 ranks under mpirun. Rank 0 prints. Sizes take K/M/G suffixes (powers of 2)."};
  app.add_option("--min-size", min_text, "smallest message size in bytes")->capture_default_str();
  app.add_option("--max-size", max_text, "largest message size in bytes (sizes double from --min-size)")
      ->capture_default_str();
  auto* iters = app.add_option("--iterations,-i", s.iterations, "timed iterations per size below --large-size")
                    ->capture_default_str()
                    ->check(CLI::PositiveNumber);
  auto* iters_large =
      app.add_option("--iterations-large", s.iterations_large,
                     "timed iterations per size from --large-size on (default: " + std::to_string(s.iterations_large) +
                         ", at most --iterations)")
          ->check(CLI::PositiveNumber);
  auto* warm = app.add_option("--warmup,-x", s.warmup, "untimed iterations before timing, below --large-size")
                   ->capture_default_str();
  auto* warm_large = app.add_option(
      "--warmup-large", s.warmup_large,
      "untimed iterations from --large-size on (default: " + std::to_string(s.warmup_large) + ", at most --warmup)");
  app.add_option("--large-size", s.large_size, "first size that uses the large counts")->capture_default_str();
  app.add_option("--batches", s.batches, "the timed loop runs in this many batches; the median batch is reported")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  std::string routes = "all";
  app.add_option("--routes", routes,
                 "all: when the peer is off the node and the build has UCX, time ubep over both off-node routes "
                 "(mpi and ucx, one Context each) in this run; default: the default route only")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "default"}));
  app.add_option("--mpi-thread", thread,
                 "the thread level to initialize MPI with; auto: single (as OSU's MPI_Init: MPI takes no locks), or "
                 "multiple with UBEP_PROGRESS_THREAD=1. Below multiple, ubep's MPI calls on the mpi route run inline, "
                 "without their deadline (UBEP_MPI_BOUNDED needs MPI_THREAD_MULTIPLE)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "single", "funneled", "serialized", "multiple"}));
  app.add_option("--bind", s.bind,
                 "auto: when the ranks of a host arrive unbound and it has a core for each, bind each rank to its "
                 "own core (the binding is printed in the header); none: run as launched")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none"}));
  if (spec.memory_option) {
    app.add_option("--memory", s.memory,
                   "host: ubep's buffers in the host heap; device: in the GPU heap (Context::alloc_device, OSU's -d "
                   "cuda; UBEP_GPU_EMULATE=1 emulates one in host memory for testing); the MPI baselines stay in "
                   "host memory")
        ->capture_default_str()
        ->check(CLI::IsMember({"host", "device"}));
  }
  app.add_flag("--csv", s.csv, "comma-separated rows (the '# ' header lines stay)");
  auto* json = app.add_option("--json", json_path,
                              "write JSON results to FILE; '--json' alone or '--json -' writes them to stdout "
                              "instead of the table")
                   ->expected(0, 1);
  try {
    app.parse(argc, argv);
    s.min_size = size_arg(min_text, "--min-size");
    s.max_size = size_arg(max_text, "--max-size");
    if (s.min_size > s.max_size) throw CLI::ValidationError("--min-size", "must not exceed --max-size");
    if (s.max_size > (std::size_t{1} << 30)) throw CLI::ValidationError("--max-size", "at most 1G");
    if (iters->count() && !iters_large->count())
      s.iterations_large = std::min(spec.default_iterations_large, s.iterations);
    if (warm->count() && !warm_large->count()) s.warmup_large = std::min(spec.default_warmup_large, s.warmup);
    if (json->count()) s.json = json_path;
    s.mpi_thread = thread_level_name(provided) + " (--mpi-thread " + thread + ")";
    s.all_routes = routes == "all";
  } catch (const CLI::ParseError& e) {
    const int rc = world_rank == 0 ? app.exit(e) : e.get_exit_code();
    MPI_Finalize();
    return rc;
  }
  if (world_size != 2) {
    if (world_rank == 0) std::fprintf(stderr, "%s: needs exactly 2 ranks (got %d)\n", spec.name.c_str(), world_size);
    MPI_Finalize();
    return 2;
  }

  int rc = 0;
  try {
    s.binding = bind_ranks(s.bind, MPI_COMM_WORLD);  // before the Context: its threads inherit the binding
    ubep::Context ctx(MPI_COMM_WORLD);
    const OtherRoute other = other_route(ctx, s.all_routes);
    std::unique_ptr<ubep::Context> second = other_context(other);
    {
      std::vector<ubep::Context*> contexts{&ctx};
      if (second) contexts.push_back(second.get());
      Bench bench(spec.name, spec.description, s, std::move(contexts), other.why_not);
      body(bench);
      bench.finish();
    }
    if (second) second->finalize();
    ctx.finalize();
  } catch (const CheckFailed& e) {
    // Every rank threw (agree() is collective), so the context was finalized on the way out.
    if (world_rank == 0) std::fprintf(stderr, "%s: FAILED: %s\n", spec.name.c_str(), e.what());
    rc = 1;
  } catch (const std::exception& e) {
    // One rank alone may have failed while its peer waits in a ping-pong: end the whole job.
    std::fprintf(stderr, "%s: rank %d: error: %s\n", spec.name.c_str(), world_rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace ubep::bench
