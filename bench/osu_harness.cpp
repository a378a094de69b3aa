/// \file osu_harness.cpp
/// The Bench of the OSU-style harness (osu_harness.hpp): its set-up (the baselines' communicator, the routes),
/// its columns, and its output: the header lines, the rows (text table or CSV) and the JSON. The timed loops
/// and the waits: osu_timing.cpp; buffers, windows and payload patterns: osu_buffers.cpp; run_benchmark and
/// the command line: osu_run.cpp.
#include "bench/osu_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ubep/config.hpp"

namespace ubep::bench {

void mpi_fail(int code, const char* call) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ubep::throw_mpi_error(code, rank, "baseline", call);
}

std::vector<std::size_t> Settings::sizes() const {
  std::vector<std::size_t> out;
  std::size_t s = min_size;
  if (s == 0) {
    out.push_back(0);
    s = 1;
  }
  for (; s <= max_size; s *= 2) out.push_back(s);
  return out;
}

std::string route_name(ubep::Route r) { return ubep::to_string(r); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// ---- Bench ---------------------------------------------------------------------------------------------

struct Bench::Json {
  nlohmann::json doc;
};

namespace {

std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, static_cast<std::size_t>(len));
  if (const auto nl = lib.find('\n'); nl != std::string::npos) lib.resize(nl);
  while (!lib.empty() && (lib.back() == ' ' || lib.back() == '\0' || lib.back() == ',')) lib.pop_back();
  return lib;
}

std::string format_value(std::optional<double> v, int precision) {
  if (!v) return "n/a";
  char text[64];
  // A positive value too small for the fixed precision (a bandwidth of a few bytes on a loaded machine)
  // keeps three significant digits instead of printing as 0.00.
  if (*v > 0.0 && *v < 0.5 * std::pow(10.0, -precision)) {
    std::snprintf(text, sizeof text, "%.3g", *v);
  } else {
    std::snprintf(text, sizeof text, "%.*f", precision, *v);
  }
  return text;
}

// Right-aligned columns of at least 16 characters, always separated by two spaces.
int width(const std::string& title) { return static_cast<int>(std::max<std::size_t>(16, title.size() + 2)); }

// Ratios span 0.001 to 1000: three significant digits keep both ends readable.
std::string format_ratio(std::optional<double> v) {
  if (!v) return "n/a";
  char text[64];
  std::snprintf(text, sizeof text, "%.3g", *v);
  return text;
}

}  // namespace

Bench::Bench(std::string name, std::string description, const Settings& settings, std::vector<ubep::Context*> contexts,
             std::string routes_note)
    : name_(std::move(name)),
      description_(std::move(description)),
      settings_(settings),
      contexts_(std::move(contexts)),
      routes_note_(std::move(routes_note)),
      json_(std::make_unique<Json>()) {
  ubep::Context& ctx = *contexts_.front();
  UBEP_BENCH_MPI(MPI_Comm_dup(ctx.comm(), &comm_));
  UBEP_BENCH_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  UBEP_BENCH_MPI(MPI_Comm_rank(comm_, &rank_));
  spin_only_ = (settings_.binding.by == "ubep" || settings_.binding.by == "launcher") &&
               std::none_of(contexts_.begin(), contexts_.end(), [](const ubep::Context* c) {
                 return c->options().progress_thread == ubep::ProgressThread::on;
               });
  const int peer = 1 - rank_;
  for (ubep::Context* c : contexts_) routes_.push_back({route_name(c->route(peer)), c, c == contexts_.front()});
  std::sort(routes_.begin(), routes_.end(),
            [peer](const UbepRoute& a, const UbepRoute& b) { return a.ctx->route(peer) < b.ctx->route(peer); });
}

Bench::~Bench() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::vector<Column> Bench::ubep_columns(const std::string& unit, const std::string& metric, int precision) const {
  std::vector<Column> out;
  for (const UbepRoute& r : routes_) {
    out.push_back({routes_.size() == 1 ? "ubep" + unit : "ubep_" + r.name + unit, "ubep", r.name, metric, precision});
  }
  return out;
}

std::vector<Ratio> Bench::ubep_ratios(const std::vector<Column>& columns, const std::vector<Ratio>& ratios) const {
  if (routes_.size() == 1 || ratios.empty()) return ratios;
  const std::size_t baseline = ratios.front().denominator;
  std::string title = columns.at(baseline).title;
  if (const auto unit = title.find('('); unit != std::string::npos) title.resize(unit);
  std::vector<Ratio> out;
  for (std::size_t i = 0; i < routes_.size(); ++i)
    out.push_back({"ubep_" + routes_[i].name + "/" + title, i, baseline});
  return out;
}

void Bench::start(const std::vector<std::string>& notes, std::vector<Column> columns, std::vector<Ratio> ratios) {
  columns_ = std::move(columns);
  ratios_ = std::move(ratios);
  if (rank_ != 0) return;
  const Settings& s = settings_;
  const ubep::Context& ctx = *contexts_.front();
  const std::string route = route_name(ctx.route(1));
  const auto through_mpi = [](const ubep::Context& c) { return c.atomics_through_mpi() ? "yes" : "no"; };
  std::vector<std::string> head;
  head.push_back(name_ + ": " + description_);
  head.push_back(std::string("ubep ") + UBEP_VERSION_STRING + "; MPI library: " + mpi_library());
  nlohmann::json routes_json = nlohmann::json::array();
  std::vector<std::string> names;
  for (const UbepRoute& r : routes_) {
    names.push_back(r.name);
    routes_json.push_back({{"route", r.name},
                           {"default", r.is_default},
                           {"transports", join(r.ctx->options().transports, ",")},
                           {"atomics_through_mpi", r.ctx->atomics_through_mpi()}});
  }
  if (routes_.size() == 1) {
    head.push_back("ranks: " + std::to_string(ctx.size()) + "; ubep route to rank 1: " + route +
                   (routes_note_.empty() ? "" : " (one route: " + routes_note_ + ")") +
                   "; atomics and signals through MPI: " + through_mpi(ctx));
  } else {
    head.push_back("ranks: " + std::to_string(ctx.size()) + "; ubep routes to rank 1: " + join(names, ", ") +
                   ", both timed in this run, one Context each (--routes default: the default route only)");
    for (const UbepRoute& r : routes_) {
      head.push_back("  ubep_" + r.name + ": " +
                     (r.is_default ? std::string("the default Context (the settings below)")
                                   : "a second Context, the settings below with UBEP_TRANSPORTS=" +
                                         join(r.ctx->options().transports, ",")) +
                     "; atomics and signals through MPI: " + through_mpi(*r.ctx));
    }
  }
  nlohmann::json settings_json = nlohmann::json::object();
  for (const std::string& kv : ctx.options().describe()) {
    head.push_back("  " + kv);
    const auto eq = kv.find('=');
    settings_json[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  {
    std::string where;
    for (std::size_t r = 0; r < s.binding.cpus.size(); ++r)
      where += (r ? ", rank " : "; rank ") + std::to_string(r) + " on CPU " + s.binding.cpus[r];
    head.push_back("binding: " + s.binding.summary + where);
  }
  head.push_back("MPI thread level: " + s.mpi_thread);
  if (device_memory()) {
    head.push_back("memory: device (--memory device, OSU's -d cuda): ubep's buffers in the GPU heap, " +
                   ctx.info().gpu_heap + "; the MPI baselines on host memory (Debian's MPIs are not CUDA-aware)");
  } else {
    head.push_back("memory: host");
  }
  head.push_back("iterations: " + std::to_string(s.iterations) + " below " + std::to_string(s.large_size) + " B, " +
                 std::to_string(s.iterations_large) + " from " + std::to_string(s.large_size) +
                 " B; warm-up: " + std::to_string(s.warmup) + " / " + std::to_string(s.warmup_large) +
                 "; each value is the median of " + std::to_string(s.batches) + " batches");
  for (const std::string& n : notes) head.push_back(n);

  auto& doc = json_->doc;
  doc["benchmark"] = name_;
  doc["description"] = description_;
  doc["ubep_version"] = UBEP_VERSION_STRING;
  doc["mpi_library"] = mpi_library();
  doc["ranks"] = ctx.size();
  doc["route"] = route;  // the default route; "routes" lists every route of the ubep records
  doc["routes"] = names;
  doc["ubep_routes"] = routes_json;
  doc["settings"] = settings_json;
  doc["mpi_thread_level"] = s.mpi_thread;
  doc["memory"] = s.memory;
  if (device_memory()) doc["gpu_heap"] = ctx.info().gpu_heap;
  doc["binding"] = {
      {"mode", s.binding.mode}, {"by", s.binding.by}, {"summary", s.binding.summary}, {"cpus", s.binding.cpus}};
  doc["iterations"] = s.iterations;
  doc["iterations_large"] = s.iterations_large;
  doc["warmup"] = s.warmup;
  doc["warmup_large"] = s.warmup_large;
  doc["large_size"] = s.large_size;
  doc["batches"] = s.batches;
  doc["statistic"] = "median over batches of the mean time per iteration";
  doc["notes"] = notes;
  doc["results"] = nlohmann::json::array();

  if (s.json && (s.json->empty() || *s.json == "-")) return;  // stdout carries the JSON only
  for (const std::string& line : head) std::printf("# %s\n", line.c_str());
  if (s.csv) {
    std::printf("Size");
    for (const Column& c : columns_) std::printf(",%s", c.title.c_str());
    for (const Ratio& r : ratios_) std::printf(",%s", r.title.c_str());
  } else {
    std::printf("%-10s", "# Size");
    for (const Column& c : columns_) std::printf("%*s", width(c.title), c.title.c_str());
    for (const Ratio& r : ratios_) std::printf("%*s", width(r.title), r.title.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

void Bench::row(std::size_t size, const std::vector<std::optional<double>>& values) {
  if (rank_ != 0) return;
  if (values.size() != columns_.size()) throw std::logic_error("Bench::row: one value per column expected");
  const std::uint64_t iterations = settings_.iterations_for(size);
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    const Column& c = columns_[i];
    nlohmann::json rec = {{"impl", c.impl}, {"route", c.route}, {"size", size}, {"iterations", iterations}};
    rec[c.metric] = values[i] ? nlohmann::json(*values[i]) : nlohmann::json(nullptr);
    rec["available"] = values[i].has_value();
    json_->doc["results"].push_back(std::move(rec));
  }
  const Settings& s = settings_;
  if (s.json && (s.json->empty() || *s.json == "-")) return;
  std::vector<std::string> cells;
  for (std::size_t i = 0; i < columns_.size(); ++i) cells.push_back(format_value(values[i], columns_[i].precision));
  for (const Ratio& r : ratios_) {
    const auto& a = values.at(r.numerator);
    const auto& b = values.at(r.denominator);
    cells.push_back(format_ratio(a && b && *b > 0 ? std::optional<double>(*a / *b) : std::nullopt));
  }
  if (s.csv) {
    std::printf("%zu", size);
    for (const std::string& c : cells) std::printf(",%s", c.c_str());
  } else {
    std::printf("%-10zu", size);
    std::vector<int> widths;
    for (const Column& c : columns_) widths.push_back(width(c.title));
    for (const Ratio& r : ratios_) widths.push_back(width(r.title));
    for (std::size_t i = 0; i < cells.size(); ++i) std::printf("%*s", widths[i], cells[i].c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

void Bench::finish() {
  if (rank_ != 0 || !settings_.json) return;
  const std::string text = json_->doc.dump(1) + "\n";
  if (settings_.json->empty() || *settings_.json == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  std::ofstream out(*settings_.json);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write the JSON output to " + *settings_.json);
}

}  // namespace ubep::bench
