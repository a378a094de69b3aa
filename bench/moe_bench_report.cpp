/// \file moe_bench_report.cpp
/// The reporting of ubep_moe_bench: the text table (column titles, one row per implementation, the ubep/bsp
/// ratio rows), the JSON record of a result, the closing summary lines next to the UBEP paper's figures, and
/// the plot (bench/moe_plot.py, after MPI_Finalize).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/moe_bench.hpp"

#ifndef UBEP_MOE_PLOT_SCRIPT
#define UBEP_MOE_PLOT_SCRIPT "bench/moe_plot.py"
#endif

namespace ubep::bench::moe_bench {

namespace {

const char* kRowFormat =
    "%8s %7s %5s %8s %6s %8s %8s %9s %-5s %-9s %-10s %12s %12s %12s %11s %17s %17s %17s %17s %11s\n";

/// A byte cell: "mean/max" in the unit of the max ("1.5/2.0KiB", "0/0B").
std::string bytes_cell(std::uint64_t mean, std::uint64_t max) {
  if (max < 1024) return fmt("%llu/%lluB", static_cast<unsigned long long>(mean), static_cast<unsigned long long>(max));
  const char* units[] = {"KiB", "MiB", "GiB"};
  double scale = 1024.0;
  std::size_t u = 0;
  while (u + 1 < std::size(units) && static_cast<double>(max) >= scale * 1024.0) {
    scale *= 1024.0;
    ++u;
  }
  return fmt("%.1f/%.1f%s", static_cast<double>(mean) / scale, static_cast<double>(max) / scale, units[u]);
}

/// ubep/bsp of one byte column (means over ranks); "-" when the baseline sent nothing there.
std::string bytes_ratio(std::uint64_t u, std::uint64_t b) {
  return b == 0 ? std::string("-") : fmt("%.3f", static_cast<double>(u) / static_cast<double>(b));
}

}  // namespace

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t u = 0;
  while (u + 1 < std::size(units) && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt("%.0f B", bytes) : fmt("%.1f %s", bytes, units[u]);
}

void print_columns() {
  std::printf("%-8s %7s %5s %8s %6s %8s %8s %9s %-5s %-9s %-10s %12s %12s %12s %11s %17s %17s %17s %17s %11s\n",
              "# tokens", "hidden", "topk", "experts", "dtype", "routing", "compute", "impl", "route", "schedule",
              "combine", "dispatch_us", "combine_us", "layer_us", "buffer_MiB", "disp_on", "disp_off", "comb_on",
              "comb_off", "floor_us");
}

void print_row(const Args& a, const Result& r) {
  std::printf(kRowFormat, std::to_string(r.tokens).c_str(), std::to_string(a.hidden).c_str(),
              std::to_string(a.topk).c_str(), std::to_string(a.experts).c_str(), a.dtype.c_str(), r.routing.c_str(),
              fmt("%.2f", r.compute).c_str(), r.impl.c_str(), r.route.c_str(), r.schedule.c_str(), r.combine.c_str(),
              fmt("%.1f", r.dispatch_us).c_str(), fmt("%.1f", r.combine_us).c_str(), fmt("%.1f", r.layer_us).c_str(),
              fmt("%.1f", static_cast<double>(r.buffer_bytes) / kMiB).c_str(),
              bytes_cell(r.mean.dispatch_on_node, r.max.dispatch_on_node).c_str(),
              bytes_cell(r.mean.dispatch_off_node, r.max.dispatch_off_node).c_str(),
              bytes_cell(r.mean.combine_on_node, r.max.combine_on_node).c_str(),
              bytes_cell(r.mean.combine_off_node, r.max.combine_off_node).c_str(),
              r.floor_us > 0.0 ? fmt("%.1f", r.floor_us).c_str() : "-");
}

void print_ratio(const Args& a, const Result& u, const Result& b) {
  std::printf(kRowFormat, std::to_string(u.tokens).c_str(), std::to_string(a.hidden).c_str(),
              std::to_string(a.topk).c_str(), std::to_string(a.experts).c_str(), a.dtype.c_str(), u.routing.c_str(),
              fmt("%.2f", u.compute).c_str(), "ubep/bsp", u.route.c_str(), u.schedule.c_str(), u.combine.c_str(),
              fmt("%.3f", u.dispatch_us / b.dispatch_us).c_str(), fmt("%.3f", u.combine_us / b.combine_us).c_str(),
              fmt("%.3f", u.layer_us / b.layer_us).c_str(), "-",
              bytes_ratio(u.mean.dispatch_on_node, b.mean.dispatch_on_node).c_str(),
              bytes_ratio(u.mean.dispatch_off_node, b.mean.dispatch_off_node).c_str(),
              bytes_ratio(u.mean.combine_on_node, b.mean.combine_on_node).c_str(),
              bytes_ratio(u.mean.combine_off_node, b.mean.combine_off_node).c_str(),
              u.floor_us > 0.0 ? fmt("%.3f", u.layer_us / u.floor_us).c_str() : "-");
}

void print_off_node_ratios(const std::vector<Result>& ubep, const Result& b) {
  if (ubep.empty()) return;
  const Result& c = ubep.front();
  std::string line =
      fmt("# off-node bytes per call ubep/bsp (%d tokens/rank, %s, %.2f us/token; dispatch + combine, "
          "mean over ranks; bsp %s):",
          c.tokens, c.routing.c_str(), c.compute, human_bytes(static_cast<double>(b.mean.off_node())).c_str());
  if (b.mean.off_node() == 0) {
    line += " n/a, no off-node traffic (every peer on one node)";
  } else {
    for (const Result& u : ubep)
      line += " " + u.label + " " +
              fmt("%.3f", static_cast<double>(u.mean.off_node()) / static_cast<double>(b.mean.off_node())) +
              (&u == &ubep.back() ? "" : ",");
  }
  std::printf("%s\n", line.c_str());
}

nlohmann::json to_json(const Args& a, int ranks, const Result& r) {
  auto bytes = [](const Bytes& b) {
    return nlohmann::json{{"dispatch_on_node", b.dispatch_on_node},
                          {"dispatch_off_node", b.dispatch_off_node},
                          {"combine_on_node", b.combine_on_node},
                          {"combine_off_node", b.combine_off_node}};
  };
  return {{"impl", r.impl},
          {"label", r.label},
          {"route", r.route},
          {"schedule", r.schedule},
          {"combine", r.combine},
          {"routing", r.routing},
          {"tokens", r.tokens},
          {"hidden", a.hidden},
          {"topk", a.topk},
          {"experts", a.experts},
          {"ranks", ranks},
          {"dtype", a.dtype},
          {"memory", a.memory},
          {"compute_us_per_token", r.compute},
          {"dispatch_us", r.dispatch_us},
          {"combine_us", r.combine_us},
          {"layer_us", r.layer_us},
          {"buffer_bytes", r.buffer_bytes},
          {"iterations", r.iterations},
          {"warmup", r.warmup},
          {"run_ahead", r.run_ahead},
          {"heap_bytes", r.heap_bytes},
          {"zero_copy", r.zero_copy},
          {"bytes_per_call", {{"mean", bytes(r.mean)}, {"max", bytes(r.max)}}},
          {"floor_bytes", r.floor_bytes},
          {"floor_us", r.floor_us > 0.0 ? nlohmann::json(r.floor_us) : nlohmann::json()},
          {"layer_over_floor", r.floor_us > 0.0 ? nlohmann::json(r.layer_us / r.floor_us) : nlohmann::json()}};
}

namespace {

/// "12.3% lower" or "4.5% higher (slower)", from a ubep/bsp ratio of times.
std::string change(double ratio) {
  const double pct = (1.0 - ratio) * 100.0;
  return pct >= 0.0 ? fmt("%.1f%% lower", pct) : fmt("%.1f%% higher (ubep slower)", -pct);
}

std::string case_name(const Result& r) {
  return fmt("%d tokens/rank, %s routing, %.2f us/token compute, route %s, schedule %s, combine %s", r.tokens,
             r.routing.c_str(), r.compute, r.route.c_str(), r.schedule.c_str(), r.combine.c_str());
}

}  // namespace

std::vector<std::string> summarize(const std::vector<std::pair<Result, Result>>& pairs, nlohmann::json& out) {
  std::vector<std::string> lines;
  lines.push_back("UBEP paper: up to 52.4% lower communication latency, 11.1% better time per output token");
  struct Best {
    const Result* u = nullptr;
    const Result* b = nullptr;
    double ratio = 0.0, worst = 0.0;
    int cases = 0;
  };
  auto best_of = [&](auto wanted) {
    Best best;
    for (const auto& [u, b] : pairs) {
      if (!wanted(u)) continue;
      const double r = u.layer_us / b.layer_us;
      if (!best.u || r < best.ratio) {
        best.u = &u;
        best.b = &b;
        best.ratio = r;
      }
      best.worst = best.cases ? std::max(best.worst, r) : r;
      ++best.cases;
    }
    return best;
  };
  // Communication latency: the layer time without expert compute (dispatch and combine end to end).
  const Best comm = best_of([](const Result& r) { return r.compute == 0.0; });
  // The analogue of time per output token: the layer time with expert compute (all cases if none has it).
  Best layer = best_of([](const Result& r) { return r.compute > 0.0; });
  const bool layer_all = !layer.u;
  if (layer_all) layer = best_of([](const Result&) { return true; });
  std::string here = "here: ";
  if (comm.u) {
    here += change(comm.ratio) + " dispatch+combine latency (" +
            (comm.ratio > 1.0 ? "even in the best case: " : "best case: ") + case_name(*comm.u) +
            fmt(": ubep %.1f us vs bsp %.1f us)", comm.u->layer_us, comm.b->layer_us);
    out["comm_latency_reduction_pct"] = (1.0 - comm.ratio) * 100.0;
    out["comm_best_case"] = case_name(*comm.u);
  } else {
    here += "no case without expert compute, so no dispatch+combine latency";
  }
  lines.push_back(here + ",");
  if (layer.u) {
    lines.push_back("      " + change(layer.ratio) + " layer time (" +
                    (layer.ratio > 1.0 ? "even in the best case: " : "best case: ") + case_name(*layer.u) +
                    fmt(": ubep %.1f us vs bsp %.1f us)", layer.u->layer_us, layer.b->layer_us));
    out["layer_time_reduction_pct"] = (1.0 - layer.ratio) * 100.0;
    out["layer_best_case"] = case_name(*layer.u);
  }
  if (comm.u)
    lines.push_back(fmt("dispatch+combine latency over the %d cases without compute: from ", comm.cases) +
                    change(comm.ratio) + " (best) to " + change(comm.worst) + " (worst)");
  if (layer.u)
    lines.push_back(fmt("layer time over the %d cases%s: from ", layer.cases, layer_all ? "" : " with compute") +
                    change(layer.ratio) + " (best) to " + change(layer.worst) + " (worst)");
  // With several routes (--routes), each one's range of layer time ubep/bsp, over every case and schedule.
  std::vector<std::string> routes;
  for (const auto& [u, b] : pairs)
    if (std::find(routes.begin(), routes.end(), u.route) == routes.end()) routes.push_back(u.route);
  if (routes.size() > 1) {
    for (const std::string& route : routes) {
      const Best r = best_of([&route](const Result& x) { return x.route == route; });
      lines.push_back(
          fmt("route %s: layer time ubep/bsp from %.3f (best) to %.3f (worst) over its %d cases and "
              "schedules",
              route.c_str(), r.ratio, r.worst, r.cases));
      out["per_route"][route] = {
          {"best_ratio", r.ratio}, {"worst_ratio", r.worst}, {"cases", r.cases}, {"best_case", case_name(*r.u)}};
    }
  }
  // With several combine modes (--combine), each one's range of layer time and of off-node bytes ubep/bsp.
  std::vector<std::string> modes;
  for (const auto& [u, b] : pairs)
    if (std::find(modes.begin(), modes.end(), u.combine) == modes.end()) modes.push_back(u.combine);
  if (modes.size() > 1) {
    for (const std::string& mode : modes) {
      const Best r = best_of([&mode](const Result& x) { return x.combine == mode; });
      double lo = 0.0, hi = 0.0;
      int with_off = 0;
      for (const auto& [u, b] : pairs) {
        if (u.combine != mode || b.mean.off_node() == 0) continue;
        const double x = static_cast<double>(u.mean.off_node()) / static_cast<double>(b.mean.off_node());
        lo = with_off ? std::min(lo, x) : x;
        hi = with_off ? std::max(hi, x) : x;
        ++with_off;
      }
      lines.push_back(fmt("combine %s: layer time ubep/bsp from %.3f (best) to %.3f (worst) over its %d cases; ",
                          mode.c_str(), r.ratio, r.worst, r.cases) +
                      (with_off ? fmt("off-node bytes ubep/bsp %.3f to %.3f", lo, hi)
                                : std::string("no off-node bytes (one node)")));
      out["per_combine"][mode] = {{"best_ratio", r.ratio},
                                  {"worst_ratio", r.worst},
                                  {"cases", r.cases},
                                  {"best_case", case_name(*r.u)},
                                  {"off_node_bytes_ratio_min", with_off ? nlohmann::json(lo) : nlohmann::json()},
                                  {"off_node_bytes_ratio_max", with_off ? nlohmann::json(hi) : nlohmann::json()}};
    }
  }
  // How far each mode is from the memory floor, over the cases without compute (the floor counts no compute).
  for (const std::string& mode : modes) {
    double lo = 0.0, hi = 0.0;
    int cases = 0;
    for (const auto& [u, b] : pairs) {
      if (u.combine != mode || u.compute != 0.0 || u.floor_us <= 0.0) continue;
      const double x = u.layer_us / u.floor_us;
      lo = cases ? std::min(lo, x) : x;
      hi = cases ? std::max(hi, x) : x;
      ++cases;
    }
    if (!cases) continue;
    lines.push_back(
        fmt("combine %s: ubep/floor from %.2f to %.2f over its %d cases without compute", mode.c_str(), lo, hi, cases));
    out["per_combine"][mode]["floor_ratio_min"] = lo;
    out["per_combine"][mode]["floor_ratio_max"] = hi;
  }
  lines.push_back(
      "(dispatch+combine latency = layer_us of the cases without expert compute; layer time = layer_us with the "
      "synthetic expert compute; reductions are 1 - ubep/bsp of medians measured in the same job)");
  return lines;
}

int plot(const Args& a) {
  const std::string json = !a.json.empty() ? a.json : a.plot + ".json";
  const char* python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const std::string cmd =
      std::string(python) + " " + quote(UBEP_MOE_PLOT_SCRIPT) + " " + quote(json) + " -o " + quote(a.plot);
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::fprintf(stderr, "ubep_moe_bench: the plot failed (%s returned %d)\n", cmd.c_str(), rc);
    return 3;
  }
  std::printf("# plot written to %s\n", a.plot.c_str());
  return 0;
}

}  // namespace ubep::bench::moe_bench
