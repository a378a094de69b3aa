#include "bench/common.hpp"

#include <sched.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <span>

#include "base/poll.hpp"
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

// ---- buffers and patterns ------------------------------------------------------------------------------

Buffer::Buffer(std::size_t bytes) {
  constexpr std::size_t kPage = 4096;
  const std::size_t rounded = std::max<std::size_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kPage, rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);  // touch every page before timing
  ptr_.reset(p);
}

void Buffer::Free::operator()(std::byte* p) const noexcept { std::free(p); }

namespace {
// The (i >> 8) term makes the pattern differ from itself shifted by 256 bytes, so a copy that lands at
// a wrong offset is caught too.
std::uint8_t pattern_byte(std::size_t i, std::uint32_t seed) {
  return static_cast<std::uint8_t>(i * 7 + (i >> 8) * 3 + seed * 13 + 1);
}
}  // namespace

void fill_pattern(void* dst, std::size_t bytes, std::uint32_t seed) {
  auto* p = static_cast<std::uint8_t*>(dst);
  for (std::size_t i = 0; i < bytes; ++i) p[i] = pattern_byte(i, seed);
}

bool check_pattern(const void* src, std::size_t bytes, std::uint32_t seed, const char* what) {
  const auto* p = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (p[i] != pattern_byte(i, seed)) {
      std::fprintf(stderr, "check failed: %s: %zu-byte payload differs at offset %zu: got %u, expected %u\n", what,
                   bytes, i, unsigned{p[i]}, unsigned{pattern_byte(i, seed)});
      return false;
    }
  }
  return true;
}

ubep::Symmetric<std::byte> Bench::alloc(ubep::Context& ctx, std::size_t bytes) const {
  return device_memory() ? ctx.alloc_device<std::byte>(bytes) : ctx.alloc<std::byte>(bytes);
}

void Bench::fill(ubep::Context& ctx, std::byte* dst, std::size_t bytes, std::uint32_t seed) const {
  if (!device_memory()) return fill_pattern(dst, bytes, seed);
  std::vector<std::byte> host(bytes);
  fill_pattern(host.data(), bytes, seed);
  ctx.put(dst, host.data(), bytes, ctx.rank());  // into this rank's GPU heap, complete on return
}

void Bench::zero(ubep::Context& ctx, std::byte* dst, std::size_t bytes) const {
  if (!device_memory()) {
    std::memset(dst, 0, bytes);
    return;
  }
  const std::vector<std::byte> host(bytes);
  ctx.put(dst, host.data(), bytes, ctx.rank());
}

bool Bench::check(ubep::Context& ctx, const std::byte* src, std::size_t bytes, std::uint32_t seed,
                  const char* what) const {
  if (!device_memory()) return check_pattern(src, bytes, seed, what);
  std::vector<std::byte> host(bytes);
  ctx.get(host.data(), src, bytes, ctx.rank());
  return check_pattern(host.data(), bytes, seed, what);
}

Window::Window(Kind kind, std::size_t bytes, MPI_Comm comm) {
  // Baseline windows are built exactly as OSU builds them (no info hints), then held in one passive
  // epoch for their whole life (MPI_Win_lock_all; OSU's -s flush locks the one target: the same cost per
  // put and flush, measured against OSU 7.2 in docs/BENCHMARKS.md).
  const auto size = static_cast<MPI_Aint>(std::max<std::size_t>(bytes, 64));
  if (kind == Kind::allocate) {
    UBEP_BENCH_MPI(MPI_Win_allocate(size, 1, MPI_INFO_NULL, comm, &base_, &win_));
  } else if (kind == Kind::create) {
    memory_ = std::make_unique<Buffer>(static_cast<std::size_t>(size));
    base_ = memory_->data();
    UBEP_BENCH_MPI(MPI_Win_create(base_, size, 1, MPI_INFO_NULL, comm, &win_));
  } else {
    UBEP_BENCH_MPI(MPI_Win_allocate_shared(size, 1, MPI_INFO_NULL, comm, &base_, &win_));
#if UBEP_SIMGRID
    // SMPI 3.32's MPI_Win_shared_query answers the segment's start for every rank (as the runtime's node
    // heap works around it, docs/SIMULATION.md "Simulated scale"); all ranks share one address space, so the bases
    // themselves are exchanged.
    int ranks = 0;
    UBEP_BENCH_MPI(MPI_Comm_size(comm, &ranks));
    peer_bases_.resize(static_cast<std::size_t>(ranks));
    UBEP_BENCH_MPI(MPI_Allgather(&base_, sizeof base_, MPI_BYTE, peer_bases_.data(), sizeof base_, MPI_BYTE, comm));
#endif
  }
  UBEP_BENCH_MPI(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
  UBEP_BENCH_MPI(MPI_Win_lock_all(0, win_));
  std::memset(base_, 0, static_cast<std::size_t>(size));
  UBEP_BENCH_MPI(MPI_Win_sync(win_));
}

Window::~Window() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
}

std::byte* Window::peer_base(int rank) const {
  if (!peer_bases_.empty()) return peer_bases_.at(static_cast<std::size_t>(rank));
  MPI_Aint size = 0;
  int disp = 0;
  void* ptr = nullptr;
  UBEP_BENCH_MPI(MPI_Win_shared_query(win_, rank, &size, &disp, &ptr));
  return static_cast<std::byte*>(ptr);
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

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
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

std::vector<double> Bench::time(std::size_t size, const std::vector<Loop>& loops) const {
  const std::uint64_t iterations = settings_.iterations_for(size);
  const std::uint64_t batches =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(static_cast<std::uint64_t>(settings_.batches), iterations));
  const std::uint64_t warmup = settings_.warmup_for(size);
  for (const Loop& l : loops) {
    barrier();
    l(warmup);
  }
  // The other loops' batches ran in between and took the caches (at 64 KiB put_bw moves 4 MiB per
  // iteration and a batch holds 2): each batch starts warm again, as OSU's one loop is after its skip
  // (with 1 iteration put_bw at 64 KiB still measured 21 GB/s where OSU's one loop gives 33, with 2: 31).
  const std::uint64_t rewarm = warmup == 0 ? 0 : std::max<std::uint64_t>(2, warmup / batches);
  std::vector<std::vector<double>> per_iteration(loops.size());
  for (std::uint64_t b = 0; b < batches; ++b) {
    // Spread the remainder so that the batches add up to exactly `iterations`.
    const std::uint64_t n = iterations / batches + (b < iterations % batches ? 1 : 0);
    for (std::size_t i = 0; i < loops.size(); ++i) {
      barrier();
      loops[i](rewarm);
      const auto t0 = Clock::now();
      loops[i](n);
      const auto t1 = Clock::now();
      per_iteration[i].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(n));
    }
  }
  barrier();
  std::vector<double> out;
  for (auto& v : per_iteration) out.push_back(median(std::move(v)));
  return out;
}

void Bench::progress_all() const {
  for (ubep::Context* c : contexts_) c->progress();
}

void Bench::wait(MPI_Request& request) const {
#if UBEP_SIMGRID
  // A simulated rank that polls costs wall time for every poll (smpi/test each) and, at hundreds of ranks,
  // hours: it issues its own deferred signals once, then blocks. In simulation no peer needs this rank's
  // progress for its own to complete (signals are messages, which wait in MPI until applied; puts land
  // without the target).
  progress_all();
  UBEP_BENCH_MPI(MPI_Wait(&request, MPI_STATUS_IGNORE));
  return;
#endif
  const std::uint32_t spin = contexts_.front()->options().poll.spin;
  for (std::uint64_t polls = 0;; ++polls) {
    int done = 0;
    UBEP_BENCH_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    progress_all();
    if (spin_only_ || polls < spin) {
      ubep::detail::cpu_relax();
    } else {
      sched_yield();
    }
  }
}

void Bench::barrier() const {
#if UBEP_SIMGRID  // blocking, as in wait(); SMPI's MPI_Ibarrier is linear, its MPI_Barrier is not
  progress_all();
  UBEP_BENCH_MPI(MPI_Barrier(comm_));
#else
  MPI_Request request = MPI_REQUEST_NULL;
  UBEP_BENCH_MPI(MPI_Ibarrier(comm_, &request));
  wait(request);
#endif
}

void Bench::agree(bool ok, const std::string& what) const {
  int all = ok ? 1 : 0;
#if UBEP_SIMGRID
  progress_all();
  UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_));
#else
  MPI_Request request = MPI_REQUEST_NULL;
  UBEP_BENCH_MPI(MPI_Iallreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_, &request));
  wait(request);
#endif
  if (!all) throw CheckFailed(what);
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

// ---- main --------------------------------------------------------------------------------------------

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
