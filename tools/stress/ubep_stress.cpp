// ubep-stress: the soak tool of issue 14. Every rank runs rounds of mixed operations from a seeded plan
// (stress_plan.hpp): puts, gets and their nbi forms of random sizes and offsets, put_signal/put_signal_nbi/
// signal_op with set and add, every atomic, fence/quiet/flush/flush_local/progress and test*, waits of every
// kind, and every --moe-every rounds MoE calls with random configs checked against BspLayer
// (stress_moe.cpp); random sleeps on random ranks, and now and then one rank that stops calling ubep for up to
// --stall-ms. Every byte written or read and every signal and counter is compared with what the plans say it
// must be. At the end rank 0 prints operations, bytes checked, mismatches and latency percentiles per call.
//
// One round r, on every rank w: phases A to G, described in stress_runner.hpp (the Runner plays them).
// This file: the command line, the set-up of the Context and the plans' settings, and the summary rank 0
// prints (and writes as JSON).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stress_core.hpp"
#include "stress_plan.hpp"
#include "stress_runner.hpp"
#include "ubep/ubep.hpp"

namespace ubep::stress {
namespace {

std::string us(std::uint64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(ns) / 1000.0);
  return b;
}

int main_impl(int argc, char** argv) {
  Settings s;
  CLI::App app{"ubep-stress: the soak test (issue 14). Run under mpirun; every rank gets the same options."};
  app.add_option("--duration", s.duration_s, "seconds to run (rank 0 decides, at the end of a round)");
  app.add_option("--ops", s.max_ops, "stop once the ranks did this many operations in total (0 = no limit)");
  app.add_option("--rounds", s.max_rounds, "stop after this many rounds (0 = no limit)");
  app.add_option("--seed", s.seed, "the seed every plan derives from (a mismatch names it and its round)");
  app.add_option("--json", s.json, "write a machine-readable summary to this file (rank 0)");
  app.add_option("--delay-prob", s.delay_prob, "chance of a random sleep before each operation");
  app.add_option("--delay-max-us", s.delay_max_us, "longest random sleep");
  app.add_option("--stall-every", s.stall_every, "rounds between stalls on average (0 = never)");
  app.add_option("--stall-ms", s.stall_max_ms, "longest stall: a rank that makes no ubep call for that long");
  app.add_option("--stall-min-ms", s.stall_min_ms, "shortest stall");
  app.add_option("--moe-every", s.moe_every, "an MoE section every N rounds (0 = never)");
  app.add_option("--quiet-every", s.quiet_every, "one completion call (fence/quiet/flush/...) per N operations");
  app.add_option("--ops-per-round", s.ops_per_round, "planned operations per rank and round");
  app.add_option("--max-bytes", s.max_bytes, "largest put or get (sizes are log-uniform from 1)");
  app.add_option("--heap-size", s.heap, "symmetric heap per rank unless UBEP_HEAP_SIZE is set");
  app.add_option("--self-atomics", s.self_atomics,
                 "auto|on|off: may a rank update its own counters while the others do (auto: not when the atomics "
                 "go through MPI, docs/ROUTES.md \"Known limit\")");
  app.add_option("--report-every", s.report_every_s, "seconds between progress lines (0 = none)");
  app.add_option("--print-limit", s.print_limit, "mismatches printed per rank (all are counted)");
  app.add_option("--inject", s.inject,
                 "self-check: rank 0 breaks one thing on purpose (data, stale, signal, counter, swap, cas, get, moe); "
                 "the run must then fail")
      ->check(CLI::IsMember({"none", "data", "stale", "signal", "counter", "swap", "cas", "get", "moe"}));
  app.add_option("--inject-round", s.inject_round, "the round of --inject");
  app.add_option("--first-round", s.first_round,
                 "replay: start at this round (its plans are those of a run from 0; a mismatch or error names its "
                 "round)");
  CLI11_PARSE(app, argc, argv);
  if (s.stall_min_ms > s.stall_max_ms) s.stall_min_ms = s.stall_max_ms;
  if (s.max_bytes < 1 || s.ops_per_round < 1 || s.quiet_every < 1) {
    std::fprintf(stderr, "ubep-stress: --max-bytes, --ops-per-round and --quiet-every must be >= 1\n");
    return 2;
  }

  Options opts = Options::from_env();
  if (std::getenv("UBEP_HEAP_SIZE") == nullptr) opts.heap_size = parse_size(s.heap, "--heap-size");
  Context ctx(MPI_COMM_WORLD, opts);
  const int P = ctx.size(), me = ctx.rank();
  PlanSettings ps;
  ps.seed = s.seed;
  ps.ranks = P;
  ps.ops_per_round = s.ops_per_round;
  ps.max_bytes = s.max_bytes;
  ps.completion_prob = 1.0 / s.quiet_every;
  ps.self_atomics = s.self_atomics == "on" || (s.self_atomics == "auto" && !ctx.atomics_through_mpi());
  ctx.agree("ubep-stress settings",
            {static_cast<std::int64_t>(s.seed), s.ops_per_round, static_cast<std::int64_t>(s.max_bytes), s.moe_every,
             ps.self_atomics ? 1 : 0, static_cast<std::int64_t>(s.stall_every * 1000),
             static_cast<std::int64_t>(s.duration_s * 1000), static_cast<std::int64_t>(s.max_ops)},
            {"seed", "ops_per_round", "max_bytes", "moe_every", "self_atomics", "stall_every", "duration", "ops"});

  const RuntimeInfo info = ctx.info();
  std::map<std::string, int> routes;
  for (Route r : info.routes) ++routes[to_string(r)];
  std::string transports, route_text;
  for (const auto& t : info.transports) transports += (transports.empty() ? "" : ",") + t;
  for (const auto& [name, n] : routes) route_text += (route_text.empty() ? "" : " ") + name + "x" + std::to_string(n);
  const char* atomics = ctx.atomics_through_mpi() ? "mpi" : info.ucx.empty() ? "load/store" : "ucx";
  if (me == 0) {
    std::printf("# ubep-stress: %d ranks on %d node(s), seed %" PRIu64 ", duration %.0f s, ops %" PRIu64
                ", %d ops/round, max %zu bytes, moe every %d rounds, delay prob %g (max %u us), stall every %g "
                "rounds (%u-%u ms)\n",
                P, ctx.topology().num_nodes(), s.seed, s.duration_s, s.max_ops, s.ops_per_round, s.max_bytes,
                s.moe_every, s.delay_prob, s.delay_max_us, s.stall_every, s.stall_min_ms, s.stall_max_ms);
    std::printf("# rank 0: transports %s, routes %s, atomics %s, self atomics %s, UBEP_WAIT_TIMEOUT %.0f s\n",
                transports.c_str(), route_text.c_str(), atomics, ps.self_atomics ? "on" : "off",
                ctx.options().wait_timeout.count());
    std::fflush(stdout);
  }

  Runner runner(ctx, s, ps);
  std::uint64_t rounds = 0;
  try {
    rounds = runner.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-stress: ERROR rank %d at %s: %s\n", me, runner.where().c_str(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
  const double elapsed = runner.elapsed_s();

  // Sum everything on rank 0 (every rank is past its last wait: a plain MPI collective is safe after barrier).
  ctx.barrier();
  const Counters& c = runner.counters();
  std::vector<std::uint64_t> sums{c.bytes_checked, c.words_checked,    c.mismatches,  c.moe_calls,
                                  c.moe_tokens,    c.zero_token_calls, c.delays,      c.stalls,
                                  c.stall_ms,      c.cas_retries,      c.cas_gave_up, runner.ops()};
  std::vector<std::uint64_t> tot(sums.size());
  MPI_Reduce(sums.data(), tot.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM, 0, ctx.comm());
  std::uint64_t first = c.first_mismatch_round, first_all = 0;
  MPI_Reduce(&first, &first_all, 1, MPI_UINT64_T, MPI_MIN, 0, ctx.comm());
  std::vector<std::uint64_t> per_rank(P);
  MPI_Gather(&c.mismatches, 1, MPI_UINT64_T, per_rank.data(), 1, MPI_UINT64_T, 0, ctx.comm());
  std::vector<Hist> all(kOps);
  for (int k = 0; k < kOps; ++k) {
    const Hist& h = runner.hist()[k];
    MPI_Reduce(h.counts.data(), all[k].counts.data(), Hist::kBuckets, MPI_UINT64_T, MPI_SUM, 0, ctx.comm());
    MPI_Reduce(&h.n, &all[k].n, 1, MPI_UINT64_T, MPI_SUM, 0, ctx.comm());
    MPI_Reduce(&h.max_ns, &all[k].max_ns, 1, MPI_UINT64_T, MPI_MAX, 0, ctx.comm());
  }

  int rc = 0;
  if (me == 0) {
    const std::uint64_t ops = tot[11], mism = tot[2];
    std::printf("# rounds %" PRIu64 ", %.1f s, operations %" PRIu64 " (%.0f/s), bytes checked %" PRIu64
                ", words checked %" PRIu64 ", mismatches %" PRIu64 "\n",
                rounds, elapsed, ops, static_cast<double>(ops) / std::max(elapsed, 1e-9), tot[0], tot[1], mism);
    std::printf("# moe calls %" PRIu64 " (%" PRIu64 " tokens, %" PRIu64 " zero-token calls), delays %" PRIu64
                ", stalls %" PRIu64 " (%" PRIu64 " ms), compare_swap retries %" PRIu64 " (gave up %" PRIu64 ")\n",
                tot[3], tot[4], tot[5], tot[6], tot[7], tot[8], tot[9], tot[10]);
    std::printf("%-18s %12s %10s %10s %10s %12s\n", "# op", "count", "p50_us", "p99_us", "p99.9_us", "max_us");
    nlohmann::json jops = nlohmann::json::object();
    for (int k = 0; k < kOps; ++k) {
      const Hist& h = all[k];
      if (h.n == 0) continue;
      std::printf("%-18s %12" PRIu64 " %10s %10s %10s %12s\n", to_string(static_cast<Op>(k)), h.n,
                  us(h.quantile(0.5)).c_str(), us(h.quantile(0.99)).c_str(), us(h.quantile(0.999)).c_str(),
                  us(h.max_ns).c_str());
      jops[to_string(static_cast<Op>(k))] = {{"count", h.n},
                                             {"p50_us", h.quantile(0.5) / 1000.0},
                                             {"p99_us", h.quantile(0.99) / 1000.0},
                                             {"p99.9_us", h.quantile(0.999) / 1000.0},
                                             {"max_us", h.max_ns / 1000.0}};
    }
    if (mism == 0) {
      std::printf("ubep-stress: PASSED: %" PRIu64 " operations, %" PRIu64 " bytes checked, 0 mismatches\n", ops,
                  tot[0]);
    } else {
      std::string who;
      for (int x = 0; x < P; ++x)
        if (per_rank[x] > 0) who += " rank " + std::to_string(x) + ": " + std::to_string(per_rank[x]);
      std::printf("ubep-stress: FAILED: %" PRIu64 " mismatches (%s), the first in round %" PRIu64
                  "; rerun with --seed %" PRIu64 "\n",
                  mism, who.c_str() + 1, first_all, s.seed);
      rc = 1;
    }
    std::fflush(stdout);
    if (!s.json.empty()) {
      nlohmann::json j;
      j["tool"] = "ubep-stress";
      j["version"] = UBEP_VERSION_STRING;
      j["ranks"] = P;
      j["nodes"] = ctx.topology().num_nodes();
      j["seed"] = s.seed;
      j["transports"] = info.transports;
      j["routes"] = routes;
      j["atomics"] = atomics;
      j["self_atomics"] = ps.self_atomics;
      j["options"] = ctx.options().describe();
      j["settings"] = {{"duration_s", s.duration_s},       {"ops", s.max_ops},
                       {"ops_per_round", s.ops_per_round}, {"max_bytes", s.max_bytes},
                       {"moe_every", s.moe_every},         {"quiet_every", s.quiet_every},
                       {"delay_prob", s.delay_prob},       {"delay_max_us", s.delay_max_us},
                       {"stall_every", s.stall_every},     {"stall_ms", {s.stall_min_ms, s.stall_max_ms}}};
      j["rounds"] = rounds;
      j["elapsed_s"] = elapsed;
      j["operations"] = ops;
      j["bytes_checked"] = tot[0];
      j["words_checked"] = tot[1];
      j["mismatches"] = mism;
      j["mismatches_per_rank"] = per_rank;
      if (mism > 0) j["first_mismatch_round"] = first_all;
      j["moe"] = {{"calls", tot[3]}, {"tokens", tot[4]}, {"zero_token_calls", tot[5]}};
      j["delays"] = tot[6];
      j["stalls"] = {{"count", tot[7]}, {"total_ms", tot[8]}};
      j["compare_swap"] = {{"retries", tot[9]}, {"gave_up", tot[10]}};
      j["latency"] = jops;
      j["passed"] = mism == 0;
      std::ofstream(s.json) << j.dump(2) << "\n";
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, ctx.comm());
  ctx.finalize();
  return rc;
}

}  // namespace
}  // namespace ubep::stress

int main(int argc, char** argv) {
  try {
    return ubep::stress::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ubep-stress: ERROR: %s\n", e.what());
    std::fflush(stderr);
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
}
