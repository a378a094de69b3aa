/// \file moe_bench.cpp
/// ubep_moe_bench: the MoE dispatch/combine benchmark, ubep's main job. On every rank, one MoE layer call
/// is: dispatch the rank's tokens to the ranks of their top-k experts, run each local expert as soon as
/// its tokens are in, send its outputs back, and sum them with the top-k weights. It is timed for ubep
/// (moe::Layer: one-sided puts + signals, topology schedule) and for the plain-MPI baseline
/// (moe::BspLayer: MPI_Alltoall + MPI_Alltoallv) in the same job, iteration by iteration interleaved, after
/// a correctness check that both give bit-identical results equal to a serial reference.
///
/// Run: mpirun -np 4 build/bench/ubep_moe_bench [--tokens 128,2048] [--json FILE] [--plot FILE.png]; see
/// docs/MOE_BENCH.md. Exit status: 0 ok, 1 a correctness check failed (on every rank), 2 any other error
/// (the job is aborted), 3 the plot could not be written.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/common.hpp"
#include "ubep/config.hpp"
#include "ubep/context.hpp"
#include "ubep/moe.hpp"
#include "ubep/topology.hpp"

#ifndef UBEP_MOE_PLOT_SCRIPT
#define UBEP_MOE_PLOT_SCRIPT "bench/moe_plot.py"
#endif

namespace {

namespace moe = ubep::moe;
using ubep::bench::CheckFailed;
using Clock = std::chrono::steady_clock;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr const char* kBspSchedule = "alltoallv";  // the "schedule" of the baseline in rows and JSON

// ---- settings ----------------------------------------------------------------------------------------

struct Args {
  std::vector<int> tokens{128, 2048};
  int hidden = 7168;
  int topk = 8;
  int experts = 32;
  std::string dtype = "bf16";
  int iterations = 0;  // 0: by size, see iterations_for()
  int warmup = -1;     // -1: by size
  std::vector<std::string> routing{"uniform", "skewed"};
  double zipf = 1.2;
  std::vector<double> compute{0.0, 2.0};
  std::string compute_mode = "spin";
  std::vector<std::string> schedules;  // empty: UBEP_SCHEDULE (default topology)
  unsigned run_ahead = 0;              // 0: UBEP_RUN_AHEAD, lowered to 1 when the heap exceeds the budget
  std::string heap_budget;             // empty: a quarter of physical memory over the ranks of the node
  int check_tokens = 8;
  std::string json;
  std::string plot;
  bool quick = false;

  // Decode-like sizes get 50 iterations, prefill-like sizes 5: about the same bytes per size.
  int iterations_for(int n) const {
    if (iterations > 0) return iterations;
    return std::clamp(static_cast<int>(std::lround(50.0 * 128.0 / n)), 5, 50);
  }
  int warmup_for(int n) const { return warmup >= 0 ? warmup : std::max(1, iterations_for(n) / 10); }
};

// ---- small helpers -----------------------------------------------------------------------------------

std::string mpi_library() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  UBEP_BENCH_MPI(MPI_Get_library_version(version, &len));
  std::string lib(version, static_cast<std::size_t>(len));
  if (const auto nl = lib.find('\n'); nl != std::string::npos) lib.resize(nl);
  while (!lib.empty() && (lib.back() == ' ' || lib.back() == '\0' || lib.back() == ',')) lib.pop_back();
  return lib;
}

std::string fmt(const char* format, auto... values) {
  char text[512];
  std::snprintf(text, sizeof text, format, values...);
  return text;
}

std::string mib(std::size_t bytes) { return fmt("%.1f MiB", static_cast<double>(bytes) / kMiB); }

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

/// The private communicator of the benchmark itself (barriers, maxima, checks): never mixed with the
/// traffic of either implementation.
class Comm {
 public:
  Comm() {
    UBEP_BENCH_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    UBEP_BENCH_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    UBEP_BENCH_MPI(MPI_Comm_rank(comm_, &rank_));
    UBEP_BENCH_MPI(MPI_Comm_size(comm_, &size_));
    MPI_Comm node = MPI_COMM_NULL;
    UBEP_BENCH_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    UBEP_BENCH_MPI(MPI_Comm_size(node, &node_size_));
    UBEP_BENCH_MPI(MPI_Comm_free(&node));
  }
  ~Comm() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int node_size() const { return node_size_; }
  void barrier() const { UBEP_BENCH_MPI(MPI_Barrier(comm_)); }
  void max(std::span<double> v) const {
    UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, comm_));
  }
  std::uint64_t max(std::uint64_t v) const {
    UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_MAX, comm_));
    return v;
  }
  unsigned bit_or(unsigned v) const {
    UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UNSIGNED, MPI_BOR, comm_));
    return v;
  }
  /// Throws CheckFailed on every rank unless `ok` holds on every rank.
  void agree(bool ok, const std::string& what) const {
    int all = ok ? 1 : 0;
    UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_));
    if (!all) throw CheckFailed(what);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, node_size_ = 1;
};

// ---- inputs ------------------------------------------------------------------------------------------

/// One rank's input of one layer call.
struct Inputs {
  int n = 0;
  std::vector<std::byte> tokens;  // [n x hidden] of dtype
  std::vector<float> scales;      // [n], e4m3 only
  std::vector<int> idx;           // [n x topk], distinct per token
  std::vector<float> weights;     // [n x topk], positive, summing to 1 per token
};

/// Uniform: topk distinct experts uniformly at random. Skewed: topk distinct experts drawn without
/// replacement from a Zipf(s) law over a fixed expert permutation (the same on every rank, so one expert
/// is hot for everyone). Token values are uniform in [-1, 1]. Seeded by rank, size and routing.
Inputs make_inputs(const moe::Config& cfg, int n, const std::string& routing, double zipf, int rank) {
  Inputs in;
  in.n = n;
  const auto hidden = static_cast<std::size_t>(cfg.hidden);
  const auto topk = static_cast<std::size_t>(cfg.topk);
  const auto un = static_cast<std::size_t>(n);
  std::mt19937_64 rng(0x9E3779B97F4A7C15ULL ^ (static_cast<std::uint64_t>(rank) * 1000003ULL) ^
                      (static_cast<std::uint64_t>(n) << 32) ^ (routing == "skewed" ? 0x5157ULL : 0x1234ULL));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);

  in.tokens.resize(un * hidden * moe::element_size(cfg.dtype));
  if (cfg.dtype == moe::DType::e4m3) in.scales.resize(un);
  std::vector<float> row(hidden);
  for (std::size_t t = 0; t < un; ++t) {
    for (float& x : row) x = value(rng);
    std::byte* dst = in.tokens.data() + t * hidden * moe::element_size(cfg.dtype);
    switch (cfg.dtype) {
      case moe::DType::f32: std::memcpy(dst, row.data(), hidden * sizeof(float)); break;
      case moe::DType::bf16:
        for (std::size_t j = 0; j < hidden; ++j) {
          const std::uint16_t b = moe::float_to_bf16(row[j]);
          std::memcpy(dst + j * 2, &b, 2);
        }
        break;
      case moe::DType::e4m3: {
        float amax = 0.0f;
        for (float x : row) amax = std::max(amax, std::fabs(x));
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        in.scales[t] = scale;
        for (std::size_t j = 0; j < hidden; ++j) dst[j] = static_cast<std::byte>(moe::float_to_e4m3(row[j] / scale));
        break;
      }
    }
  }

  const int experts = cfg.num_experts;
  std::vector<double> law(static_cast<std::size_t>(experts), 1.0);
  std::vector<int> order(static_cast<std::size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  if (routing == "skewed") {
    std::mt19937 shared(20240611u);  // same permutation on every rank: one globally hot expert
    std::shuffle(order.begin(), order.end(), shared);
    for (int i = 0; i < experts; ++i) law[static_cast<std::size_t>(i)] = 1.0 / std::pow(i + 1.0, zipf);
  }
  in.idx.resize(un * topk);
  in.weights.resize(un * topk);
  std::vector<double> left(law.size());
  for (std::size_t t = 0; t < un; ++t) {
    left = law;
    float sum = 0.0f;
    for (std::size_t k = 0; k < topk; ++k) {
      double total = 0.0;
      for (double w : left) total += w;
      double pick = std::uniform_real_distribution<double>(0.0, total)(rng);
      std::size_t i = 0;
      while (i + 1 < left.size() && (left[i] == 0.0 || pick >= left[i])) {
        pick -= left[i];
        ++i;
      }
      while (left[i] == 0.0) --i;  // rounding at the end of the range: take the last one still free
      left[i] = 0.0;
      in.idx[t * topk + k] = order[i];
      in.weights[t * topk + k] = 0.1f + unit(rng);
      sum += in.weights[t * topk + k];
    }
    for (std::size_t k = 0; k < topk; ++k) in.weights[t * topk + k] /= sum;
  }
  return in;
}

// ---- experts -----------------------------------------------------------------------------------------

/// The arithmetic expert of the correctness check: y = x * (1 + 0.01 * (e + 1)), in float, rounded to
/// output_dtype. x is the dispatched value (bf16/f32 as is, e4m3 times its token's scale).
float expert_factor(int expert) { return 1.0f + 0.01f * static_cast<float>(expert + 1); }

float load(moe::DType t, const std::byte* row, std::size_t j, float scale) {
  switch (t) {
    case moe::DType::f32: {
      float f;
      std::memcpy(&f, row + j * 4, 4);
      return f;
    }
    case moe::DType::bf16: {
      std::uint16_t b;
      std::memcpy(&b, row + j * 2, 2);
      return moe::bf16_to_float(b);
    }
    case moe::DType::e4m3: return moe::e4m3_to_float(static_cast<std::uint8_t>(row[j])) * scale;
  }
  return 0.0f;
}

/// Stores y in the output type and returns the value it reads back as.
float store(moe::DType out_type, std::byte* row, std::size_t j, float y) {
  if (out_type == moe::DType::f32) {
    std::memcpy(row + j * 4, &y, 4);
    return y;
  }
  const std::uint16_t b = moe::float_to_bf16(y);
  std::memcpy(row + j * 2, &b, 2);
  return moe::bf16_to_float(b);
}

class ArithmeticExpert {
 public:
  explicit ArithmeticExpert(const moe::Config& cfg) : cfg_(cfg) {}
  std::span<const std::byte> operator()(const moe::ExpertTokens& t) {
    const auto hidden = static_cast<std::size_t>(cfg_.hidden);
    const moe::DType out_type = moe::output_dtype(cfg_.dtype);
    const std::size_t in_row = hidden * moe::element_size(cfg_.dtype);
    const std::size_t out_row = hidden * moe::element_size(out_type);
    out_.resize(static_cast<std::size_t>(t.count) * out_row);
    const float f = expert_factor(t.expert);
    for (std::size_t i = 0; i < static_cast<std::size_t>(t.count); ++i) {
      const float scale = cfg_.dtype == moe::DType::e4m3 ? t.scales[i] : 1.0f;
      const std::byte* src = t.data.data() + i * in_row;
      std::byte* dst = out_.data() + i * out_row;
      for (std::size_t j = 0; j < hidden; ++j) store(out_type, dst, j, load(cfg_.dtype, src, j, scale) * f);
    }
    return out_;
  }

 private:
  moe::Config cfg_;
  std::vector<std::byte> out_;
};

/// The expert of the timed iterations: the identity (for bf16/f32 its outputs are its input buffer, no
/// copy; for e4m3 a bf16 buffer of zeros), plus a synthetic compute cost of `us_per_token` microseconds
/// per token: a busy loop on the clock (spin) or a sleep (sleep, like an accelerator kernel that leaves
/// the CPU free). Both implementations get the same expert, so the difference is communication.
class TimedExpert {
 public:
  TimedExpert(const moe::Config& cfg, double us_per_token, bool sleep)
      : cfg_(cfg), us_per_token_(us_per_token), sleep_(sleep) {}
  std::span<const std::byte> operator()(const moe::ExpertTokens& t) {
    if (us_per_token_ > 0.0 && t.count > 0) {
      const auto end =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double, std::micro>(us_per_token_ * static_cast<double>(t.count)));
      if (sleep_) {
        std::this_thread::sleep_until(end);
      } else {
        while (Clock::now() < end) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        }
      }
    }
    if (cfg_.dtype != moe::DType::e4m3) return t.data;
    const std::size_t bytes = static_cast<std::size_t>(t.count) * static_cast<std::size_t>(cfg_.hidden) *
                              moe::element_size(moe::output_dtype(cfg_.dtype));
    if (zeros_.size() < bytes) zeros_.resize(bytes);
    return std::span<const std::byte>(zeros_).first(bytes);
  }

 private:
  moe::Config cfg_;
  double us_per_token_;
  bool sleep_;
  std::vector<std::byte> zeros_;
};

// ---- one layer call ----------------------------------------------------------------------------------

/// This rank's times of one call, in microseconds: dispatch = dispatch_send start until the last local
/// expert was handed out by next_expert; combine = first combine_send start until combine_recv returned;
/// layer = dispatch_send start until combine_recv returned (expert compute included).
using Sample = std::array<double, 3>;

template <class Expert>
Sample run_once(moe::LayerBase& layer, const Inputs& in, Expert& expert, std::span<float> out) {
  const auto t0 = Clock::now();
  moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
  std::optional<Clock::time_point> last_expert, first_combine;
  while (const std::optional<int> e = layer.next_expert(h)) {
    last_expert = Clock::now();
    const moe::ExpertTokens tokens = layer.expert_tokens(h, *e);
    const std::span<const std::byte> outputs = expert(tokens);
    if (!first_combine) first_combine = Clock::now();
    layer.combine_send(h, *e, outputs);
  }
  const auto no_expert = Clock::now();  // a rank without local experts has nothing to wait for
  layer.combine_recv(h, out);
  const auto t1 = Clock::now();
  return {us_between(t0, last_expert.value_or(no_expert)), us_between(first_combine.value_or(no_expert), t1),
          us_between(t0, t1)};
}

// ---- correctness -------------------------------------------------------------------------------------

/// Runs one call of every implementation with the arithmetic expert. Every ubep output must equal the
/// baseline's bit for bit, and the baseline's must equal a serial reference for a few tokens. Throws
/// CheckFailed on every rank otherwise.
void check(const Comm& comm, const moe::Config& cfg, const Inputs& in, const std::vector<moe::LayerBase*>& ubep,
           const std::vector<std::string>& schedules, moe::LayerBase& bsp, int check_tokens, const std::string& what) {
  const auto hidden = static_cast<std::size_t>(cfg.hidden);
  const auto topk = static_cast<std::size_t>(cfg.topk);
  const std::size_t n = static_cast<std::size_t>(in.n);
  ArithmeticExpert expert(cfg);
  std::vector<float> want(n * hidden);
  std::vector<float> got(n * hidden);
  bool ok = true;

  comm.barrier();
  run_once(bsp, in, expert, want);
  for (std::size_t s = 0; s < ubep.size(); ++s) {
    std::fill(got.begin(), got.end(), std::nanf(""));
    comm.barrier();
    run_once(*ubep[s], in, expert, got);
    if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) {
      std::size_t i = 0;
      while (i < got.size() && std::memcmp(&got[i], &want[i], sizeof(float)) == 0) ++i;
      std::fprintf(stderr,
                   "check failed: rank %d, %s, schedule %s: ubep output differs from bsp at token %zu element %zu: "
                   "ubep %.9g, bsp %.9g\n",
                   comm.rank(), what.c_str(), schedules[s].c_str(), i / hidden, i % hidden, got[i], want[i]);
      ok = false;
    }
  }

  // The serial reference: out[t] = sum_k w[t,k] * y_k, y_k the expert output as read back, k ascending.
  std::vector<std::size_t> picks;
  const std::size_t count = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(check_tokens, 1)));
  for (std::size_t i = 0; i < count; ++i) picks.push_back(count == 1 ? 0 : i * (n - 1) / (count - 1));
  const moe::DType out_type = moe::output_dtype(cfg.dtype);
  std::vector<std::byte> scratch(8);
  const std::size_t in_row = hidden * moe::element_size(cfg.dtype);
  for (const std::size_t t : picks) {
    const float scale = cfg.dtype == moe::DType::e4m3 ? in.scales[t] : 1.0f;
    for (std::size_t j = 0; j < hidden && ok; ++j) {
      const float x = load(cfg.dtype, in.tokens.data() + t * in_row, j, scale);
      float acc = 0.0f;
      for (std::size_t k = 0; k < topk; ++k) {
        const float y = store(out_type, scratch.data(), 0, x * expert_factor(in.idx[t * topk + k]));
        acc += in.weights[t * topk + k] * y;
      }
      if (!(acc == want[t * hidden + j])) {
        std::fprintf(stderr,
                     "check failed: rank %d, %s: bsp output of token %zu element %zu is %.9g, the serial reference "
                     "says %.9g\n",
                     comm.rank(), what.c_str(), t, j, want[t * hidden + j], acc);
        ok = false;
      }
    }
  }
  comm.agree(ok, "MoE outputs differ (" + what + "); see the messages above");
}

// ---- results -----------------------------------------------------------------------------------------

struct Result {
  std::string impl, schedule, routing;
  int tokens = 0;
  double compute = 0.0;
  double dispatch_us = 0.0, combine_us = 0.0, layer_us = 0.0;
  std::uint64_t buffer_bytes = 0;
  int iterations = 0, warmup = 0;
  unsigned run_ahead = 0;
  std::size_t heap_bytes = 0;
};

double median_of(const std::vector<Sample>& v, std::size_t metric) {
  std::vector<double> x;
  for (const Sample& s : v) x.push_back(s[metric]);
  return ubep::bench::median(std::move(x));
}

const char* kRowFormat = "%8s %7s %5s %8s %6s %8s %8s %9s %-9s %12s %12s %12s %11s\n";

void print_columns() {
  std::printf("%-8s %7s %5s %8s %6s %8s %8s %9s %-9s %12s %12s %12s %11s\n", "# tokens", "hidden", "topk", "experts",
              "dtype", "routing", "compute", "impl", "schedule", "dispatch_us", "combine_us", "layer_us", "buffer_MiB");
}

void print_row(const Args& a, const Result& r) {
  std::printf(kRowFormat, std::to_string(r.tokens).c_str(), std::to_string(a.hidden).c_str(),
              std::to_string(a.topk).c_str(), std::to_string(a.experts).c_str(), a.dtype.c_str(), r.routing.c_str(),
              fmt("%.2f", r.compute).c_str(), r.impl.c_str(), r.schedule.c_str(), fmt("%.1f", r.dispatch_us).c_str(),
              fmt("%.1f", r.combine_us).c_str(), fmt("%.1f", r.layer_us).c_str(),
              fmt("%.1f", static_cast<double>(r.buffer_bytes) / kMiB).c_str());
}

void print_ratio(const Args& a, const Result& u, const Result& b) {
  std::printf(kRowFormat, std::to_string(u.tokens).c_str(), std::to_string(a.hidden).c_str(),
              std::to_string(a.topk).c_str(), std::to_string(a.experts).c_str(), a.dtype.c_str(), u.routing.c_str(),
              fmt("%.2f", u.compute).c_str(), "ubep/bsp", u.schedule.c_str(),
              fmt("%.3f", u.dispatch_us / b.dispatch_us).c_str(), fmt("%.3f", u.combine_us / b.combine_us).c_str(),
              fmt("%.3f", u.layer_us / b.layer_us).c_str(), "-");
}

nlohmann::json to_json(const Args& a, int ranks, const Result& r) {
  return {{"impl", r.impl},
          {"schedule", r.schedule},
          {"routing", r.routing},
          {"tokens", r.tokens},
          {"hidden", a.hidden},
          {"topk", a.topk},
          {"experts", a.experts},
          {"ranks", ranks},
          {"dtype", a.dtype},
          {"compute_us_per_token", r.compute},
          {"dispatch_us", r.dispatch_us},
          {"combine_us", r.combine_us},
          {"layer_us", r.layer_us},
          {"buffer_bytes", r.buffer_bytes},
          {"iterations", r.iterations},
          {"warmup", r.warmup},
          {"run_ahead", r.run_ahead},
          {"heap_bytes", r.heap_bytes}};
}

/// "12.3% lower" or "4.5% higher (slower)", from a ubep/bsp ratio of times.
std::string change(double ratio) {
  const double pct = (1.0 - ratio) * 100.0;
  return pct >= 0.0 ? fmt("%.1f%% lower", pct) : fmt("%.1f%% higher (ubep slower)", -pct);
}

std::string case_name(const Result& r) {
  return fmt("%d tokens/rank, %s routing, %.2f us/token compute, schedule %s", r.tokens, r.routing.c_str(), r.compute,
             r.schedule.c_str());
}

/// The closing lines: our best reduction next to the UBEP paper's figures, and the whole range.
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
  lines.push_back(
      "(dispatch+combine latency = layer_us of the cases without expert compute; layer time = layer_us with the "
      "synthetic expert compute; reductions are 1 - ubep/bsp of medians measured in the same job)");
  return lines;
}

// ---- the run -----------------------------------------------------------------------------------------

std::size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

std::size_t slack(std::size_t bytes) { return std::max<std::size_t>(std::size_t{8} << 20, bytes / 32); }

/// All routings and compute costs of one size: check, then time every implementation interleaved.
void run_shape(const Args& a, const Comm& comm, const moe::Config& cfg, int iterations, int warmup,
               const std::vector<std::string>& schedules, const std::vector<moe::LayerBase*>& ubep_layers,
               moe::LayerBase& bsp_layer, unsigned run_ahead, std::size_t heap,
               std::vector<std::pair<Result, Result>>& pairs, nlohmann::json& doc) {
  const int rank = comm.rank(), ranks = comm.size(), n = cfg.max_tokens_per_rank;
  const bool root = rank == 0;
  moe::LayerBase* bsp = &bsp_layer;
  std::vector<float> out(static_cast<std::size_t>(n) * static_cast<std::size_t>(a.hidden));
  for (const std::string& routing : a.routing) {
    const Inputs in = make_inputs(cfg, n, routing, a.zipf, rank);
    check(comm, cfg, in, ubep_layers, schedules, *bsp, a.check_tokens,
          fmt("%d tokens/rank, %s routing", n, routing.c_str()));

    for (const double compute : a.compute) {
      TimedExpert expert(cfg, compute, a.compute_mode == "sleep");
      std::vector<moe::LayerBase*> impls = ubep_layers;
      impls.push_back(bsp);
      std::vector<std::vector<Sample>> samples(impls.size());
      for (int it = 0; it < warmup + iterations; ++it) {
        // Alternate who goes first, so that cache and scheduling effects of the order hit both alike.
        for (std::size_t k = 0; k < impls.size(); ++k) {
          const std::size_t i = it % 2 == 0 ? k : impls.size() - 1 - k;
          comm.barrier();
          Sample s = run_once(*impls[i], in, expert, out);
          comm.max(s);
          if (it >= warmup) samples[i].push_back(s);
        }
      }
      std::vector<Result> results;
      for (std::size_t i = 0; i < impls.size(); ++i) {
        Result r;
        r.impl = impls[i]->name();
        r.schedule = i < schedules.size() ? schedules[i] : kBspSchedule;
        r.routing = routing;
        r.tokens = n;
        r.compute = compute;
        r.dispatch_us = median_of(samples[i], 0);
        r.combine_us = median_of(samples[i], 1);
        r.layer_us = median_of(samples[i], 2);
        r.buffer_bytes = comm.max(static_cast<std::uint64_t>(impls[i]->buffer_bytes()));
        r.iterations = iterations;
        r.warmup = warmup;
        r.run_ahead = i < schedules.size() ? run_ahead : 0;
        r.heap_bytes = i < schedules.size() ? heap : 0;
        results.push_back(r);
      }
      const Result& b = results.back();
      for (std::size_t s = 0; s < schedules.size(); ++s) pairs.emplace_back(results[s], b);
      if (root) {
        for (const Result& r : results) {
          print_row(a, r);
          doc["results"].push_back(to_json(a, ranks, r));
        }
        for (std::size_t s = 0; s < schedules.size(); ++s) print_ratio(a, results[s], b);
        std::fflush(stdout);
      }
    }
  }
}

int run(const Args& a, const Comm& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool root = rank == 0;
  const ubep::Options base = ubep::Options::from_env();
  const std::vector<std::string> schedules =
      a.schedules.empty() ? std::vector<std::string>{base.schedule} : a.schedules;
  const moe::DType dtype = moe::parse_dtype(a.dtype);
  for (const std::string& s : schedules) (void)ubep::parse_schedule(s);  // throws on a bad name, before any work
  for (const std::string& r : a.routing)
    if (r != "uniform" && r != "skewed") throw std::invalid_argument("--routing: unknown routing " + r);
  const std::size_t budget = !a.heap_budget.empty()
                                 ? ubep::parse_size(a.heap_budget, "--heap-budget")
                                 : physical_memory() / 4 / static_cast<std::size_t>(comm.node_size());

  nlohmann::json doc;
  doc["benchmark"] = "ubep_moe_bench";
  doc["ubep_version"] = UBEP_VERSION_STRING;
  doc["mpi_library"] = mpi_library();
  doc["ranks"] = ranks;
  doc["statistic"] = "per iteration the maximum over ranks, then the median over iterations, microseconds";
  doc["expert"] = std::string("identity + synthetic compute (") + a.compute_mode + ")";
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
    const moe::Config cfg{a.experts, a.hidden, dtype, a.topk, n};
    const int iterations = a.iterations_for(n), warmup = a.warmup_for(n);

    // Heap and run-ahead: every schedule holds its own Context, all alive at once (interleaved runs).
    const unsigned wanted = a.run_ahead ? a.run_ahead : base.run_ahead;
    unsigned run_ahead = wanted;
    const std::size_t per_context = moe::Layer::heap_bytes(cfg, ranks, wanted);
    std::string note;
    if (!a.run_ahead && wanted > 1 && (per_context + slack(per_context)) * schedules.size() > budget) {
      run_ahead = 1;
      note = fmt("run-ahead lowered from %u to 1 for %d tokens/rank: ", wanted, n) + mib(per_context) +
             fmt(" of heap per rank and schedule at run-ahead %u exceeds the budget of ", wanted) + mib(budget) +
             " per rank (--heap-budget; default a quarter of physical memory over the ranks of a node)";
    }
    const std::size_t needed = moe::Layer::heap_bytes(cfg, ranks, run_ahead);
    // UBEP_HEAP_SIZE, when set, is a lower bound; otherwise the heap is what the Layer needs plus slack.
    const std::size_t heap = std::max(std::getenv("UBEP_HEAP_SIZE") ? base.heap_size : 0, needed + slack(needed));
    if ((heap * schedules.size()) > budget && root)
      std::fprintf(stderr, "ubep_moe_bench: warning: %zu context(s) x %s of heap per rank exceeds the budget of %s\n",
                   schedules.size(), mib(heap).c_str(), mib(budget).c_str());

    std::vector<std::unique_ptr<ubep::Context>> contexts;
    std::vector<std::unique_ptr<moe::Layer>> layers;
    for (const std::string& s : schedules) {
      ubep::Options o = base;
      o.schedule = s;
      o.heap_size = heap;
      o.run_ahead = run_ahead;
      contexts.push_back(std::make_unique<ubep::Context>(MPI_COMM_WORLD, o));
      layers.push_back(std::make_unique<moe::Layer>(*contexts.back(), cfg));
    }
    auto bsp = std::make_unique<moe::BspLayer>(*contexts.front(), cfg);
    std::vector<moe::LayerBase*> ubep_layers;
    for (auto& l : layers) ubep_layers.push_back(l.get());

    if (!header_done) {
      header_done = true;
      const ubep::Context& ctx = *contexts.front();
      unsigned routes = 0;
      for (int pe = 0; pe < ranks; ++pe) routes |= 1u << static_cast<unsigned>(ctx.route(pe));
      routes = comm.bit_or(routes);
      std::vector<std::string> used;
      for (const ubep::Route r : {ubep::Route::self, ubep::Route::shm, ubep::Route::mpi})
        if (routes & (1u << static_cast<unsigned>(r))) used.push_back(ubep::to_string(r));
      std::vector<std::string> from0;
      for (int pe = 0; pe < ranks; ++pe) from0.push_back(ubep::to_string(ctx.route(pe)));
      const auto& overrides = ctx.topology().overrides();
      const int nodes = ctx.topology().num_nodes();
      doc["nodes"] = nodes;
      doc["routes"] = used;
      doc["atomics_through_mpi"] = ctx.atomics_through_mpi();
      doc["topology_overrides"] = overrides;
      if (root) {
        std::printf(
            "# ubep MoE dispatch/combine benchmark (ubep_moe_bench): ubep moe::Layer vs MPI baseline "
            "moe::BspLayer\n");
        std::printf("# ubep %s; MPI library: %s\n", UBEP_VERSION_STRING, mpi_library().c_str());
        std::printf(
            "# ranks: %d; nodes: %d%s; routes used: %s (from rank 0: %s); atomics and signals through "
            "MPI: %s\n",
            ranks, nodes, overrides.empty() ? "" : (" (" + join(overrides, ", ") + ")").c_str(),
            join(used, ", ").c_str(), join(from0, " ").c_str(), ctx.atomics_through_mpi() ? "yes" : "no");
        std::printf("# settings (UBEP_HEAP_SIZE, UBEP_SCHEDULE, UBEP_RUN_AHEAD are set per shape below):\n");
        for (const std::string& kv : base.describe()) std::printf("#   %s\n", kv.c_str());
        std::printf(
            "# shape: hidden %d, %s, top-%d of %d experts (%d per rank); routing: %s (skewed: Zipf s=%.2f over "
            "a fixed expert order, one hot expert)\n",
            a.hidden, a.dtype.c_str(), a.topk, a.experts, bsp->experts().max_local(), join(a.routing, ",").c_str(),
            a.zipf);
        std::printf(
            "# expert: identity (outputs = its input buffer) + synthetic compute of 'compute' us per token "
            "(%s); correctness checked first with y = x*(1+0.01*(e+1)) against a serial reference\n",
            a.compute_mode.c_str());
        std::printf(
            "# times: microseconds; per iteration the maximum over ranks, reported the median over "
            "iterations; ubep and bsp iterations interleaved, each after a barrier\n");
        std::printf(
            "# dispatch: dispatch_send until the last local expert is handed out; combine: first "
            "combine_send until combine_recv returns; layer: the whole call, expert compute included\n");
        print_columns();
      }
    }
    if (root) {
      if (!note.empty()) std::printf("# %s\n", note.c_str());
      std::string order;
      for (std::size_t s = 0; s < layers.size(); ++s) {
        std::vector<std::string> peers;
        for (int p : layers[s]->schedule()) peers.push_back(std::to_string(p));
        order += (s ? "; " : "") + schedules[s] + ": " + join(peers, ",");
      }
      std::printf(
          "# %d tokens/rank: %d iterations + %d warm-up; ubep heap %s per rank and schedule "
          "(Layer::heap_bytes %s, run-ahead %u); rank 0 serves peers in order %s\n",
          n, iterations, warmup, mib(heap).c_str(), mib(needed).c_str(), run_ahead, order.c_str());
      std::fflush(stdout);
    }

    // Layers first (their symmetric memory belongs to the contexts), then the contexts, in the same order
    // on every rank. Also on a failed check, which every rank sees at the same point.
    auto release = [&] {
      bsp.reset();
      layers.clear();
      for (auto& c : contexts) c->finalize();
      contexts.clear();
    };
    try {
      run_shape(a, comm, cfg, iterations, warmup, schedules, ubep_layers, *bsp, run_ahead, heap, pairs, doc);
    } catch (const CheckFailed&) {
      release();
      throw;
    }
    release();
  }

  nlohmann::json summary = nlohmann::json::object();
  const std::vector<std::string> lines = summarize(pairs, summary);
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

/// Rank 0, after MPI_Finalize: renders the plot with bench/moe_plot.py (Debian's python3 has matplotlib,
/// a pyenv python3 first on PATH may not).
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

}  // namespace

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
                 "topology); each gets its own Context")
      ->delimiter(',');
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
  } catch (const CLI::ParseError& e) {
    const int rc = world_rank == 0 ? app.exit(e) : e.get_exit_code();
    MPI_Finalize();
    return rc;
  }

  int rc = 0;
  try {
    const Comm comm;
    rc = run(a, comm);
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
