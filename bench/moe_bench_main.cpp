/// \file moe_bench_main.cpp
/// ubep_moe_bench: the MoE dispatch/combine benchmark, ubep's main job. On every rank, one MoE layer call
/// is: dispatch the rank's tokens to the ranks of their top-k experts, run each local expert as soon as
/// its tokens are in, send its outputs back, and sum them with the top-k weights. It is timed for ubep
/// (moe::Layer: one-sided puts + signals, topology schedule) and for the plain-MPI baseline
/// (moe::BspLayer: MPI_Alltoall + MPI_Alltoallv) in the same job, iteration by iteration interleaved, after
/// a correctness check that both give bit-identical results equal to a serial reference. ubep runs once per
/// --combine mode (moe::Config::combine), and every row carries the bytes each call sent on and off the node.
///
/// Run: mpirun -np 4 build/bench/ubep_moe_bench [--tokens 128,2048] [--json FILE] [--plot FILE.png]; see
/// docs/MOE_BENCH.md. Exit status: 0 ok, 1 a correctness check failed (on every rank), 2 any other error
/// (the job is aborted, or every rank refused what --routes asks), 3 the plot could not be written.
///
/// This file: the command line (flags, --quick) and main(). The run over the sizes (heap and run-ahead from a
/// probe Context's node map, one Context per route, schedule and combine mode, one BspLayer per mode, the
/// header lines, the summary, the job's byte totals, the JSON file): moe_bench_run.cpp. Shared declarations:
/// moe_bench.hpp; the timed cases: moe_bench_cases.cpp; the table, JSON records, summary lines, plot:
/// moe_bench_report.cpp.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/moe_bench.hpp"
#include "bench/osu_harness.hpp"
#include "ubep/config.hpp"

using ubep::bench::CheckFailed;
using ubep::bench::moe_bench::Args;
using ubep::bench::moe_bench::Comm;
using ubep::bench::moe_bench::plot;
using ubep::bench::moe_bench::run;

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "ubep_moe_bench: MPI_Init_thread failed\n");
    return 2;
  }
  int world_rank = 0;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &world_rank) != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 2);

  Args a;
  CLI::App app{
      "ubep_moe_bench: MoE dispatch/combine latency of ubep (moe::Layer) vs the plain-MPI baseline (moe::BspLayer), "
      "in one job. Run under mpirun (e.g. -np 4); rank 0 prints. See docs/MOE_BENCH.md."};
  auto* tokens = app.add_option("--tokens", a.tokens, "tokens per rank, a list (e.g. 32,64,128,256,512,1024,2048)")
                     ->delimiter(',')
                     ->capture_default_str()
                     ->check(CLI::PositiveNumber);
  auto* hidden =
      app.add_option("--hidden", a.hidden, "elements per token")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--topk", a.topk, "experts per token")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--experts", a.experts, "experts in the layer")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dtype", a.dtype, "token type")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32", "e4m3"}));
  auto* iterations = app.add_option("--iterations,-i", a.iterations,
                                    "timed iterations per case (default: 50 at 128 tokens/rank, scaled down to 5 at "
                                    "2048 and above)")
                         ->check(CLI::PositiveNumber);
  auto* warmup =
      app.add_option("--warmup,-x", a.warmup, "untimed iterations per case (default: iterations/10, at least 1)")
          ->check(CLI::NonNegativeNumber);
  app.add_option("--routing", a.routing, "routings, a list: uniform, skewed")->delimiter(',')->capture_default_str();
  app.add_option("--zipf", a.zipf, "Zipf exponent of skewed routing")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto* compute = app.add_option("--compute-us-per-token", a.compute,
                                 "synthetic expert compute in microseconds per token, a list (one case each)")
                      ->delimiter(',')
                      ->capture_default_str()
                      ->check(CLI::NonNegativeNumber);
  app.add_option("--compute-mode", a.compute_mode, "spin: busy loop on the clock; sleep: sleep (frees the CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"spin", "sleep"}));
  app.add_option("--schedules", a.schedules,
                 "ubep peer schedules to run, a list of linear, shifted, topology (default: UBEP_SCHEDULE, i.e. "
                 "topology); each gets its own Context (per route)")
      ->delimiter(',');
  app.add_option("--routes", a.routes,
                 "ubep routes to time, a list of default (UBEP_TRANSPORTS as set), mpi, ucx (UBEP_TRANSPORTS forced to "
                 "self,shm,<route>: that route to every peer off the node); one Context per route and schedule, all "
                 "beside the one BSP baseline")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "mpi", "ucx"}));
  app.add_flag("--float-partials", a.float_partials,
               "moe::Config::float_partials for every layer: per_rank/per_node partial and node rows in float instead "
               "of the output dtype (the BSP baseline applies the same reduction; per_expert is unaffected)");
  app.add_option("--combine", a.combine,
                 "moe::Config::combine modes of the ubep layer, a list of automatic, per_expert, per_rank, per_node "
                 "(automatic: the mode moe::resolve_combine names on this node map; an explicit entry of that mode is "
                 "then dropped); one Context per route, schedule and mode, each checked against a BspLayer of the "
                 "same mode")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"automatic", "per_expert", "per_rank", "per_node"}));
  app.add_option("--memory", a.memory,
                 "where tokens, expert batches and sums live (moe::Config::memory, OSU's -d cuda): host, or device "
                 "(GPU memory: the inputs and sums in the GPU heap, every layer, ubep's and the baseline's, with "
                 "Config::memory device; needs a GPU, or UBEP_GPU_EMULATE=1 for testing)")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "device"}));
  app.add_option("--outputs", a.outputs,
                 "where the experts write their outputs: layer (into moe::LayerBase::expert_outputs, with "
                 "Config::zero_copy: ubep's Layer sends them without a copy; the baseline copies them as it copies any "
                 "outputs; the timed expert writes each output row once, a copy of its input), or own (the expert's "
                 "own buffer through combine_send(h, e, outputs); the timed expert returns its input, writing "
                 "nothing). --memory device uses own")
      ->capture_default_str()
      ->check(CLI::IsMember({"layer", "own"}));
  app.add_option("--run-ahead", a.run_ahead,
                 "ubep buffer sets (calls a rank may run ahead); default UBEP_RUN_AHEAD (2), lowered to 1 for a size "
                 "whose heap exceeds --heap-budget")
      ->check(CLI::PositiveNumber);
  app.add_option("--heap-budget", a.heap_budget,
                 "symmetric heap per rank above which the run-ahead is lowered to 1 (K/M/G; default a quarter of "
                 "physical memory over the ranks of a node)");
  app.add_option("--check-tokens", a.check_tokens, "tokens per rank compared with the serial reference")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--json", a.json, "write the results as JSON to FILE");
  app.add_option("--plot", a.plot, "write a PNG of latency vs tokens per rank (runs bench/moe_plot.py)");
  app.add_flag("--quick", a.quick,
               "tiny sizes for smoke tests: tokens 16,64, hidden 512, 5 iterations, 1 warm-up, compute 0,1 "
               "(flags given explicitly win)");
  try {
    app.parse(argc, argv);
    if (a.quick) {
      if (!tokens->count()) a.tokens = {16, 64};
      if (!hidden->count()) a.hidden = 512;
      if (!iterations->count()) a.iterations = 5;
      if (!warmup->count()) a.warmup = 1;
      if (!compute->count()) a.compute = {0.0, 1.0};
    }
    if (a.topk > a.experts) throw CLI::ValidationError("--topk", "must not exceed --experts");
    for (std::size_t i = 0; i < a.routes.size(); ++i) {
      if (std::find(a.routes.begin(), a.routes.begin() + static_cast<std::ptrdiff_t>(i), a.routes[i]) !=
          a.routes.begin() + static_cast<std::ptrdiff_t>(i))
        throw CLI::ValidationError("--routes", a.routes[i] + " is named twice");
      if (a.routes[i] == "ucx" && !UBEP_HAVE_UCX)
        throw CLI::ValidationError("--routes", "ucx: this build has no UCX (apt-get install libucx-dev)");
    }
    for (std::size_t i = 0; i < a.combine.size(); ++i) {
      if (std::find(a.combine.begin(), a.combine.begin() + static_cast<std::ptrdiff_t>(i), a.combine[i]) !=
          a.combine.begin() + static_cast<std::ptrdiff_t>(i))
        throw CLI::ValidationError("--combine", a.combine[i] + " is named twice");
    }
  } catch (const CLI::ParseError& e) {
    const int rc = world_rank == 0 ? app.exit(e) : e.get_exit_code();
    MPI_Finalize();
    return rc;
  }

  int rc = 0;
  try {
    const Comm comm;
    rc = run(a, comm);
  } catch (const ubep::bench::moe_bench::Refused& e) {
    // Every rank refused at once (the routes are agreed on), so the job can end cleanly.
    if (world_rank == 0) std::fprintf(stderr, "ubep_moe_bench: %s\n", e.what());
    rc = 2;
  } catch (const CheckFailed& e) {
    // Every rank threw at once (Comm::agree), so the job can end cleanly.
    if (world_rank == 0) std::fprintf(stderr, "ubep_moe_bench: FAILED: %s\n", e.what());
    rc = 1;
  } catch (const std::exception& e) {
    // One rank alone may have failed while the others wait for it: end the whole job.
    std::fprintf(stderr, "ubep_moe_bench: rank %d: error: %s\n", world_rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (MPI_Finalize() != MPI_SUCCESS) rc = rc ? rc : 2;
  if (rc == 0 && world_rank == 0 && !a.plot.empty()) rc = plot(a);
  return rc;
}
