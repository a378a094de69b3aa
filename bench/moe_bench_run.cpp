/// \file moe_bench_run.cpp
/// The run of ubep_moe_bench over the sizes: heap and run-ahead from a probe Context's node map, one Context
/// per route, schedule and combine mode, one BspLayer per mode, the header lines, the summary, the job's byte
/// totals and the JSON file. The benchmark is described in moe_bench_main.cpp (the command line and main()).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/moe_bench.hpp"
#include "bench/osu_harness.hpp"
#include "ubep/config.hpp"
#include "ubep/context.hpp"
#include "ubep/moe.hpp"
#include "ubep/topology.hpp"

namespace ubep::bench::moe_bench {

namespace {

std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  UBEP_BENCH_MPI(MPI_Get_library_version(version, &len));
  std::string lib(version, static_cast<std::size_t>(len));
  if (const auto nl = lib.find('\n'); nl != std::string::npos) lib.resize(nl);
  while (!lib.empty() && (lib.back() == ' ' || lib.back() == '\0' || lib.back() == ',')) lib.pop_back();
  return lib;
}

std::string mib(std::size_t bytes) { return fmt("%.1f MiB", static_cast<double>(bytes) / kMiB); }

// ---- routes ------------------------------------------------------------------------------------------

constexpr ubep::Route kRoutes[] = {ubep::Route::self, ubep::Route::shm, ubep::Route::mpi, ubep::Route::ucx};

unsigned bit(ubep::Route r) { return 1u << static_cast<unsigned>(r); }

/// Collective: the routes `ctx` uses from any rank to any peer, as a mask of bit(route).
unsigned routes_used(const ubep::Context& ctx, const Comm& comm) {
  unsigned used = 0;
  for (int pe = 0; pe < comm.size(); ++pe) used |= bit(ctx.route(pe));
  return comm.bit_or(used);
}

std::vector<std::string> route_names(unsigned used) {
  std::vector<std::string> out;
  for (const ubep::Route r : kRoutes)
    if (used & bit(r)) out.push_back(ubep::to_string(r));
  return out;
}

/// The label of a default Context: the farthest route it uses (ucx or mpi across nodes, shm on one node).
std::string farthest(unsigned used) {
  std::string out;
  for (const ubep::Route r : kRoutes)
    if (used & bit(r)) out = ubep::to_string(r);
  return out;
}

/// Throws Refused (on every rank alike: `used_by` is the same everywhere) when a forced route reaches no
/// peer, since its rows would time the shm route under another name, or when two entries of --routes time
/// the same route.
void check_routes(const Args& a, const std::vector<Variant>& variants, const std::vector<unsigned>& used_by) {
  const std::size_t per_route = variants.size() / a.routes.size();
  for (std::size_t i = 0; i < a.routes.size(); ++i) {
    const std::string& asked = a.routes[i];
    const std::string& label = variants[i * per_route].route;
    const std::vector<std::string> used = route_names(used_by[i * per_route]);
    if (asked != "default" && std::find(used.begin(), used.end(), asked) == used.end()) {
      throw Refused("--routes " + asked + ": no rank reaches a peer over " + asked +
                    " (every peer shares its node); run across nodes, or with UBEP_VIRTUAL_NODES");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (variants[j * per_route].route == label)
        throw Refused("--routes " + a.routes[j] + "," + asked + ": both time the " + label + " route");
    }
  }
}

// ---- the run -----------------------------------------------------------------------------------------

std::size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

std::size_t slack(std::size_t bytes) { return std::max<std::size_t>(std::size_t{8} << 20, bytes / 32); }

}  // namespace

int run(const Args& a, const Comm& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool root = rank == 0;
  const ubep::Options base = ubep::Options::from_env();
  const std::vector<std::string> schedules =
      a.schedules.empty() ? std::vector<std::string>{ubep::to_string(base.schedule)} : a.schedules;
  const moe::DType dtype = moe::parse_dtype(a.dtype);
  for (const std::string& s : schedules) (void)ubep::parse_schedule(s);  // throws on a bad name, before any work
  std::vector<moe::Combine> modes;
  for (const std::string& c : a.combine) modes.push_back(moe::parse_combine(c));
  for (const std::string& r : a.routing)
    if (r != "uniform" && r != "skewed") throw std::invalid_argument("--routing: unknown routing " + r);
  // The smallest budget of any rank, so that every rank lowers the run-ahead for the same sizes.
  const std::size_t budget = static_cast<std::size_t>(
      comm.min(!a.heap_budget.empty() ? ubep::parse_size(a.heap_budget, "--heap-budget")
                                      : physical_memory() / 4 / static_cast<std::size_t>(comm.node_size())));

  // The node map, from a probe Context (default options, a small heap): Layer::heap_bytes for per_rank and
  // per_node depends on it (per_node's relay buffers across nodes). Every rank holds the same gathered
  // Topology, so every rank computes the same heap.
  ubep::Topology topology;
  {
    ubep::Options o = base;
    o.heap_size = std::size_t{1} << 20;
    ubep::Context probe(MPI_COMM_WORLD, o);
    topology = probe.topology();
    probe.finalize();
  }
  // --combine automatic: the mode it resolves to on this node map; an explicit entry of that mode is dropped.
  std::string automatic_note;
  if (std::find(modes.begin(), modes.end(), moe::Combine::automatic) != modes.end()) {
    const moe::Combine resolved = moe::resolve_combine(moe::Combine::automatic, topology);
    automatic_note = std::string("combine automatic (the default mode) is ") + moe::to_string(resolved) +
                     " on this node map (moe::resolve_combine)";
    if (const auto it = std::find(modes.begin(), modes.end(), resolved); it != modes.end()) {
      modes.erase(it);
      automatic_note += std::string("; --combine ") + moe::to_string(resolved) + " dropped: the automatic rows time it";
    }
  }
  std::vector<std::string> mode_names;
  for (const moe::Combine m : modes) mode_names.emplace_back(moe::to_string(m));
  const std::size_t contexts_per_shape = a.routes.size() * schedules.size() * modes.size();
  // The memory floor's bandwidth: a plain copy with every rank copying at once (64 MiB per rank, 16 with --quick).
  const CopyBandwidth copy = measure_copy_bandwidth(comm, (a.quick ? 16u : 64u) << 20, a.quick ? 3 : 7);
  std::vector<int> node_of(static_cast<std::size_t>(ranks));
  for (int p = 0; p < ranks; ++p) node_of[static_cast<std::size_t>(p)] = topology.node_of(p);
  // Bytes every layer of the job sent (all calls: checks, warm-up and timed), this rank's, for the totals.
  Bytes job;

  nlohmann::json doc;
  doc["benchmark"] = "ubep_moe_bench";
  doc["ubep_version"] = UBEP_VERSION_STRING;
  doc["mpi_library"] = mpi_library();
  doc["ranks"] = ranks;
  doc["statistic"] = "per iteration the maximum over ranks, then the median over iterations, microseconds";
  doc["bytes_statistic"] =
      "bytes_per_call: LayerBase::traffic() over the timed iterations divided by the calls, per rank; mean: the "
      "mean over ranks rounded to whole bytes, max: the maximum over ranks";
  doc["combine"] = mode_names;
  doc["kernels"] = moe::kernels();
  doc["copy_bandwidth"] = {{"method", "memcpy, every rank at once, the slowest rank's time, median of the repetitions"},
                           {"buffer_bytes", copy.buffer_bytes},
                           {"repetitions", copy.repetitions},
                           {"bytes_per_us_per_rank", copy.bytes_per_us}};
  doc["float_partials"] = a.float_partials;
  doc["memory"] = a.memory;
  doc["bsp_timed_combine"] = "per_expert";
  const bool in_place = a.outputs == "layer" && a.memory == "host";
  doc["outputs"] = in_place ? "layer" : "own";
  doc["expert"] = std::string(in_place ? "identity written into expert_outputs" : "identity (outputs = its input)") +
                  " + synthetic compute (" + a.compute_mode + ")";
  doc["results"] = nlohmann::json::array();
  nlohmann::json settings = nlohmann::json::object();
  for (const std::string& kv : base.describe()) {
    const auto eq = kv.find('=');
    settings[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  doc["settings"] = settings;

  std::vector<std::pair<Result, Result>> pairs;  // (ubep, bsp) per case and schedule, for the summary
  bool header_done = false;

  for (const int n : a.tokens) {
    moe::Config shape{a.experts, a.hidden, dtype, a.topk, n};
    shape.float_partials = a.float_partials;
    shape.memory = moe::parse_memory(a.memory);
    shape.zero_copy = a.outputs == "layer" && shape.memory == moe::Memory::host;
    moe::Config& cfg = shape;
    const int iterations = a.iterations_for(n), warmup = a.warmup_for(n);

    // Heap and run-ahead: every (route, schedule) holds its own Context, all alive at once (interleaved runs).
    const unsigned wanted = a.run_ahead ? a.run_ahead : base.run_ahead;
    unsigned run_ahead = wanted;
    // Every Context gets the heap of the most demanding mode asked for, on this node map.
    auto heap_for = [&](unsigned ra) {
      std::size_t most = 0;
      for (const moe::Combine m : modes) {
        moe::Config c = cfg;
        c.combine = m;
        most = std::max(most, moe::Layer::heap_bytes(c, topology, ra));
      }
      return most;
    };
    const std::size_t per_context = heap_for(wanted);
    std::string note;
    if (!a.run_ahead && wanted > 1 && (per_context + slack(per_context)) * contexts_per_shape > budget) {
      run_ahead = 1;
      note = fmt("run-ahead lowered from %u to 1 for %d tokens/rank: ", wanted, n) + mib(per_context) +
             fmt(" of heap per rank and Context (%zu: routes x schedules x combine modes) at run-ahead %u exceeds the "
                 "budget of ",
                 contexts_per_shape, wanted) +
             mib(budget) + " per rank (--heap-budget; default a quarter of physical memory over the ranks of a node)";
    }
    if (const std::size_t zc = heap_for(run_ahead);
        cfg.zero_copy && !a.run_ahead && (zc + slack(zc)) * contexts_per_shape > budget) {
      // Config::zero_copy adds as many output rows as token rows; past the budget the experts still write into
      // expert_outputs, which is then this call's host memory, and combine_send copies it.
      cfg.zero_copy = false;
      note += std::string(note.empty() ? "" : "; ") + fmt("Config::zero_copy off for %d tokens/rank: ", n) + mib(zc) +
              " of heap per rank and Context would remain over the budget (the experts still write into "
              "expert_outputs, then host memory of the call, and combine_send copies it)";
    }
    const std::size_t needed = heap_for(run_ahead);
    // UBEP_HEAP_SIZE, when set, is a lower bound; otherwise the heap is what the Layer needs plus slack. The
    // largest over ranks, should UBEP_HEAP_SIZE differ between them (the heap is symmetric).
    const std::size_t heap = static_cast<std::size_t>(
        comm.max(std::max(std::getenv("UBEP_HEAP_SIZE") ? base.heap_size : 0, needed + slack(needed))));
    // --memory device: every Context's GPU heap holds its Layer's rows, and the first one's also the BspLayers'
    // rows, the inputs and the sums (twice: the check's and the timed ones), plus slack; UBEP_GPU_HEAP_SIZE,
    // when set, is a lower bound.
    std::size_t gpu_heap = base.gpu_heap_size;
    if (shape.memory == moe::Memory::device) {
      const std::size_t rows = moe::LayerBase::device_heap_bytes(cfg, ranks, run_ahead);
      const std::size_t inputs =
          static_cast<std::size_t>(n) * (static_cast<std::size_t>(a.hidden) * (moe::element_size(dtype) + 4) +
                                         static_cast<std::size_t>(a.topk) * 8 + 4);
      const std::size_t needed_gpu = rows * (1 + modes.size() + 1) + 2 * inputs;
      gpu_heap = static_cast<std::size_t>(comm.max(
          std::max(std::getenv("UBEP_GPU_HEAP_SIZE") ? base.gpu_heap_size : 0, needed_gpu + slack(needed_gpu))));
    }
    if ((heap * contexts_per_shape) > budget && root)
      std::fprintf(stderr, "ubep_moe_bench: warning: %zu context(s) x %s of heap per rank exceeds the budget of %s\n",
                   contexts_per_shape, mib(heap).c_str(), mib(budget).c_str());

    // One Context per (route, schedule, combine mode), route by route, then schedule by schedule; each
    // route's union over ranks of the routes used.
    std::vector<std::unique_ptr<ubep::Context>> contexts;
    std::vector<std::unique_ptr<moe::Layer>> layers;
    std::vector<Variant> variants;
    std::vector<unsigned> used_by;
    for (const std::string& route : a.routes) {
      for (const std::string& s : schedules) {
        for (const moe::Combine m : modes) {
          ubep::Options o = base;
          if (route != "default") o.transports = {"self", "shm", route};
          o.schedule = ubep::parse_schedule(s);
          o.heap_size = heap;
          o.gpu_heap_size = gpu_heap;
          o.run_ahead = run_ahead;
          moe::Config c = cfg;
          c.combine = m;
          contexts.push_back(std::make_unique<ubep::Context>(MPI_COMM_WORLD, o));
          layers.push_back(std::make_unique<moe::Layer>(*contexts.back(), c));
          used_by.push_back(routes_used(*contexts.back(), comm));
          variants.push_back({route == "default" ? farthest(used_by.back()) : route, s, moe::to_string(m)});
        }
      }
    }
    // The baselines: one BspLayer per combine mode asked for, which the check compares each ubep variant
    // with, and the per_expert one (first), which the bsp rows time: BspLayer moves the same bytes in every
    // mode, only its reduction differs. All on the first Context's communicator, in the same order everywhere.
    std::vector<std::unique_ptr<moe::BspLayer>> bsps;
    std::vector<moe::Combine> bsp_modes{moe::Combine::per_expert};
    for (const moe::Combine m : modes)
      if (std::find(bsp_modes.begin(), bsp_modes.end(), m) == bsp_modes.end()) bsp_modes.push_back(m);
    for (const moe::Combine m : bsp_modes) {
      moe::Config c = cfg;
      c.combine = m;
      bsps.push_back(std::make_unique<moe::BspLayer>(*contexts.front(), c));
    }
    std::vector<moe::LayerBase*> ubep_layers, bsp_check;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      ubep_layers.push_back(layers[i].get());
      // The BspLayer of the same resolved mode (config() resolves automatic on both sides).
      const auto same = std::find_if(bsps.begin(), bsps.end(),
                                     [&](const auto& b) { return b->config().combine == layers[i]->config().combine; });
      if (same == bsps.end()) throw std::logic_error("ubep_moe_bench: no BspLayer of the mode of a ubep layer");
      bsp_check.push_back(same->get());
    }
    moe::BspLayer& bsp = *bsps.front();

    // Layers first (their symmetric memory belongs to the contexts), then the contexts, in the same order
    // on every rank. Also on a failed check or a refusal, which every rank sees at the same point.
    auto release = [&] {
      auto add = [&job](const moe::LayerBase& l) {
        const Bytes b = bytes_of(l.traffic());
        job.dispatch_on_node += b.dispatch_on_node;
        job.dispatch_off_node += b.dispatch_off_node;
        job.combine_on_node += b.combine_on_node;
        job.combine_off_node += b.combine_off_node;
      };
      for (const auto& b : bsps) add(*b);
      for (const auto& l : layers) add(*l);
      bsps.clear();
      layers.clear();
      for (auto& c : contexts) c->finalize();
      contexts.clear();
    };
    try {
      check_routes(a, variants, used_by);
    } catch (const CheckFailed&) {
      release();
      throw;
    }

    if (!header_done) {
      header_done = true;
      const ubep::Context& ctx = *contexts.front();
      unsigned routes = 0;
      for (const unsigned u : used_by) routes |= u;
      const std::vector<std::string> used = route_names(routes);
      const auto& overrides = ctx.topology().overrides();
      const int nodes = ctx.topology().num_nodes();
      // Per route (the first Context of each): what it was asked, what it uses, from rank 0 and anywhere.
      std::vector<std::string> route_lines;
      nlohmann::json ubep_routes = nlohmann::json::array();
      const std::size_t per_route = schedules.size() * modes.size();
      for (std::size_t v = 0; v < variants.size(); v += per_route) {
        const ubep::Context& c = *contexts[v];
        const std::string& asked = a.routes[v / per_route];
        std::vector<std::string> from0;
        for (int pe = 0; pe < ranks; ++pe) from0.push_back(ubep::to_string(c.route(pe)));
        const std::string transports = join(c.options().transports, ",");
        route_lines.push_back("ubep route " + variants[v].route + " (" +
                              (asked == "default" ? "the default" : "--routes " + asked) +
                              ", UBEP_TRANSPORTS=" + transports + "): routes used " +
                              join(route_names(used_by[v]), ", ") + " (from rank 0: " + join(from0, " ") +
                              "); atomics and signals through MPI: " + (c.atomics_through_mpi() ? "yes" : "no"));
        ubep_routes.push_back({{"route", variants[v].route},
                               {"asked", asked},
                               {"transports", transports},
                               {"routes_used", route_names(used_by[v])},
                               {"atomics_through_mpi", c.atomics_through_mpi()}});
      }
      doc["nodes"] = nodes;
      doc["routes"] = used;
      doc["ubep_routes"] = ubep_routes;
      doc["atomics_through_mpi"] = ctx.atomics_through_mpi();
      doc["topology_overrides"] = overrides;
      if (root) {
        std::printf(
            "# ubep MoE dispatch/combine benchmark (ubep_moe_bench): ubep moe::Layer vs MPI baseline "
            "moe::BspLayer\n");
        std::printf("# ubep %s; MPI library: %s\n", UBEP_VERSION_STRING, mpi_library().c_str());
        std::printf("# ranks: %d; nodes: %d%s; routes used: %s (by the ubep routes below)\n", ranks, nodes,
                    overrides.empty() ? "" : (" (" + join(overrides, ", ") + ")").c_str(), join(used, ", ").c_str());
        for (const std::string& line : route_lines) std::printf("#   %s\n", line.c_str());
        std::printf("# settings (UBEP_HEAP_SIZE, UBEP_SCHEDULE, UBEP_RUN_AHEAD are set per shape below):\n");
        for (const std::string& kv : base.describe()) std::printf("#   %s\n", kv.c_str());
        std::printf(
            "# shape: hidden %d, %s, top-%d of %d experts (%d per rank); routing: %s (skewed: Zipf s=%.2f over "
            "a fixed expert order, one hot expert)\n",
            a.hidden, a.dtype.c_str(), a.topk, a.experts, bsp.experts().max_local(), join(a.routing, ",").c_str(),
            a.zipf);
        std::printf("# memory (--memory, moe::Config::memory): %s%s\n", a.memory.c_str(),
                    a.memory == "device"
                        ? (base.gpu_emulate ? ": GPU heap EMULATED in host memory (UBEP_GPU_EMULATE=1, testing)"
                                            : ": tokens, batches and sums in GPU memory")
                        : "");
        std::printf(
            "# combine modes (--combine, moe::Config::combine): %s, partial and node rows in %s (--float-partials); "
            "one ubep Context per route, schedule and mode, "
            "each checked bit for bit against a moe::BspLayer of its own mode; the bsp rows time the BspLayer with "
            "combine per_expert (a BspLayer moves one copy per (token, expert) each way in every mode, only its "
            "reduction differs)\n",
            join(mode_names, ",").c_str(), a.float_partials ? "float" : "the output dtype");
        if (!automatic_note.empty()) std::printf("# %s\n", automatic_note.c_str());
        std::printf("# MoE row kernels (UBEP_MOE_KERNELS, moe::kernels()): %s\n", moe::kernels());
        if (copy.bytes_per_us <= 0.0) {
          std::printf("# floor_us: not measured (SimGrid: simulated time does not count a memcpy)\n");
        } else {
          std::printf(
              "# floor_us: the bytes the call must move (the most any rank sent, all four byte columns, plus the "
              "expert-output rows its weighted sums read: tokens x topk rows) over the bandwidth of a plain copy with "
              "every rank copying at once, %.0f MB/s per rank (memcpy of %s, median of %d); in ubep/bsp rows: "
              "ubep's layer_us / its floor_us (compare on the cases without compute; the floor counts none)\n",
              copy.bytes_per_us, mib(copy.buffer_bytes).c_str(), copy.repetitions);
        }
        std::printf(
            "# expert: identity %s + synthetic compute of 'compute' us per token "
            "(%s); correctness checked first with y = x*(1+0.01*(e+1)) against a serial reference\n",
            in_place ? "written once into expert_outputs (--outputs layer; ubep's Layer with Config::zero_copy)"
                     : "(outputs = its input buffer, --outputs own)",
            a.compute_mode.c_str());
        std::printf(
            "# times: microseconds; per iteration the maximum over ranks, reported the median over "
            "iterations; ubep and bsp iterations interleaved, each after a barrier\n");
        std::printf(
            "# dispatch: dispatch_send until the last local expert is handed out; combine: first "
            "combine_send until combine_recv returns; layer: the whole call, expert compute included\n");
        std::printf(
            "# bytes (disp_on, disp_off, comb_on, comb_off): per call and rank, sent to other ranks on the sender's "
            "node (on) or on other nodes (off), as LayerBase::traffic() counts them (token rows in dispatch, relay "
            "forwards included; output, partial and node rows in combine; headers, weights and signals not "
            "counted), over the timed iterations; each cell is mean/max over ranks in the unit of the max; in "
            "ubep/bsp rows the ratio of the means\n");
        print_columns();
      }
    }
    if (root) {
      if (!note.empty()) std::printf("# %s\n", note.c_str());
      std::string order;  // the schedules do not depend on the route: those of the first route
      for (std::size_t s = 0; s < schedules.size(); ++s) {
        std::vector<std::string> peers;
        for (int p : layers[s * modes.size()]->schedule()) peers.push_back(std::to_string(p));
        order += (s ? "; " : "") + schedules[s] + ": " + join(peers, ",");
      }
      std::printf(
          "# %d tokens/rank: %d iterations + %d warm-up; ubep heap %s per rank and Context "
          "(Layer::heap_bytes %s, the most of the modes on this node map, run-ahead %u); rank 0 serves peers in "
          "order %s\n",
          n, iterations, warmup, mib(heap).c_str(), mib(needed).c_str(), run_ahead, order.c_str());
      std::fflush(stdout);
    }

    try {
      run_shape(a, comm, cfg, iterations, warmup, variants, ubep_layers, bsp_check, bsp, node_of, run_ahead, heap,
                cfg.memory == moe::Memory::device ? contexts.front().get() : nullptr, copy, pairs, doc);
    } catch (const CheckFailed&) {
      release();
      throw;
    }
    release();
  }

  // The whole job's bytes per rank (every layer, every call), gathered, and per node of the sender: what the
  // links between nodes carried of the layers' payload (multinode.sh puts it beside the links' counters).
  std::vector<std::uint64_t> all(static_cast<std::size_t>(ranks) * 4, 0);
  const std::uint64_t mine[4] = {job.dispatch_on_node, job.dispatch_off_node, job.combine_on_node,
                                 job.combine_off_node};
  std::copy(std::begin(mine), std::end(mine), all.begin() + static_cast<std::ptrdiff_t>(rank) * 4);
  comm.sum(all);
  nlohmann::json job_ranks = nlohmann::json::array(), job_nodes = nlohmann::json::array();
  std::vector<std::uint64_t> node_off(static_cast<std::size_t>(topology.num_nodes()), 0);
  for (int p = 0; p < ranks; ++p) {
    const std::uint64_t* b = all.data() + static_cast<std::size_t>(p) * 4;
    job_ranks.push_back({{"rank", p},
                         {"node", node_of[static_cast<std::size_t>(p)]},
                         {"host", topology.place(p).host},
                         {"dispatch_on_node", b[0]},
                         {"dispatch_off_node", b[1]},
                         {"combine_on_node", b[2]},
                         {"combine_off_node", b[3]}});
    node_off[static_cast<std::size_t>(node_of[static_cast<std::size_t>(p)])] += b[1] + b[3];
  }
  std::string job_line =
      "bytes the layers sent off their node over the whole job (every layer and call: checks, "
      "warm-up, timed), per node of the sender:";
  for (int nd = 0; nd < topology.num_nodes(); ++nd) {
    const std::vector<int> on = topology.ranks_on_node(nd);
    const std::string host = on.empty() ? std::string() : topology.place(on.front()).host;
    job_nodes.push_back({{"node", nd}, {"host", host}, {"off_node_sent", node_off[static_cast<std::size_t>(nd)]}});
    job_line += fmt(" node %d (%s) %llu B = ", nd, host.c_str(),
                    static_cast<unsigned long long>(node_off[static_cast<std::size_t>(nd)])) +
                human_bytes(static_cast<double>(node_off[static_cast<std::size_t>(nd)])) +
                (nd + 1 < topology.num_nodes() ? ";" : "");
  }
  doc["job_traffic"] = {{"per_rank", job_ranks}, {"per_node", job_nodes}};

  nlohmann::json summary = nlohmann::json::object();
  std::vector<std::string> lines = summarize(pairs, summary);
  lines.push_back(job_line);
  doc["summary"] = summary;
  doc["summary_lines"] = lines;
  if (root) {
    std::printf("#\n# Summary\n");
    for (const std::string& l : lines) std::printf("# %s\n", l.c_str());
    std::fflush(stdout);
    const std::string path = !a.json.empty() ? a.json : (a.plot.empty() ? "" : a.plot + ".json");
    if (!path.empty()) {
      std::ofstream f(path);
      f << doc.dump(1) << "\n";
      f.close();
      if (!f) throw std::runtime_error("cannot write the JSON output to " + path);
    }
  }
  return 0;
}

}  // namespace ubep::bench::moe_bench
