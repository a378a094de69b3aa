/// \file moe_bench_cases.cpp
/// The benchmark cases of ubep_moe_bench: the inputs of one layer call, the experts (arithmetic for the
/// correctness check, identity plus synthetic compute for the timing), one timed call, the check of ubep's
/// moe::Layer against the moe::BspLayer baseline and a serial reference, and the interleaved timing loops.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/moe_bench.hpp"
#include "ubep/moe.hpp"

namespace ubep::bench::moe_bench {

namespace {

using Clock = ubep::bench::Clock;  // simulated time in SimGrid builds

constexpr const char* kBspSchedule = "alltoallv";  // the "schedule" of the baseline in rows and JSON
constexpr const char* kBspRoute = "mpi";           // and its "route": MPI collectives, whatever ubep's route

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

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

/// The spans of one call: the host vectors of Inputs, or (--memory device) their copies in the GPU heap of
/// `gpu` (collective: every rank has the same n).
class Placed {
 public:
  Placed(ubep::Context* gpu, const Inputs& in) {
    if (gpu == nullptr) {
      tokens = in.tokens;
      idx = in.idx;
      weights = in.weights;
      scales = in.scales;
      return;
    }
    tokens = place(*gpu, in.tokens, tokens_);
    idx = place(*gpu, in.idx, idx_);
    weights = place(*gpu, in.weights, weights_);
    scales = place(*gpu, in.scales, scales_);
  }
  std::span<const std::byte> tokens;
  std::span<const int> idx;
  std::span<const float> weights, scales;

 private:
  template <class T>
  static std::span<const T> place(ubep::Context& gpu, const std::vector<T>& v, ubep::Symmetric<T>& object) {
    object = gpu.alloc_device<T>(v.size());
    gpu.copy(object.data(), v.data(), v.size() * sizeof(T));
    return {object.data(), v.size()};
  }
  ubep::Symmetric<std::byte> tokens_;
  ubep::Symmetric<int> idx_;
  ubep::Symmetric<float> weights_, scales_;
};

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
  /// `gpu` (--memory device): the batches are in GPU memory, read through host copies (Context::copy).
  ArithmeticExpert(const moe::Config& cfg, ubep::Context* gpu) : cfg_(cfg), gpu_(gpu) {}
  std::span<const std::byte> operator()(moe::ExpertTokens t) {
    if (gpu_ != nullptr) {
      data_.resize(t.data.size());
      scales_.resize(t.scales.size());
      gpu_->copy(data_.data(), t.data.data(), t.data.size());
      gpu_->copy(scales_.data(), t.scales.data(), t.scales.size_bytes());
      t.data = data_;
      t.scales = scales_;
    }
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
  /// The same outputs written into `rows` (expert_outputs).
  void into(const moe::ExpertTokens& t, std::span<std::byte> rows) {
    const std::span<const std::byte> y = (*this)(t);
    if (!y.empty()) std::memcpy(rows.data(), y.data(), y.size());
  }

 private:
  moe::Config cfg_;
  ubep::Context* gpu_;
  std::vector<std::byte> out_, data_;
  std::vector<float> scales_;
};

/// The expert of the timed iterations: the identity (for bf16/f32 its outputs are its input buffer, no
/// copy; for e4m3 a bf16 buffer of zeros), plus a synthetic compute cost of `us_per_token` microseconds
/// per token: a busy loop on the clock (spin) or a sleep (sleep, like an accelerator kernel that leaves
/// the CPU free). Both implementations get the same expert, so the difference is communication. Under
/// --memory device the identity hands the batch (GPU memory) back as it is, as a GPU expert's output.
class TimedExpert {
 public:
  TimedExpert(const moe::Config& cfg, double us_per_token, bool sleep)
      : cfg_(cfg), us_per_token_(us_per_token), sleep_(sleep) {}
  /// --outputs own: the expert's outputs are its input buffer (no write).
  std::span<const std::byte> operator()(const moe::ExpertTokens& t) {
    wait(t);
    if (cfg_.dtype != moe::DType::e4m3) return t.data;
    const std::size_t bytes = static_cast<std::size_t>(t.count) * static_cast<std::size_t>(cfg_.hidden) *
                              moe::element_size(moe::output_dtype(cfg_.dtype));
    if (zeros_.size() < bytes) zeros_.resize(bytes);
    return std::span<const std::byte>(zeros_).first(bytes);
  }
  /// --outputs layer: the expert writes its outputs into `rows` (expert_outputs), once, as a real expert writes
  /// its results: a copy of its input (bf16, f32), zeros (e4m3, whose outputs are bf16).
  void into(const moe::ExpertTokens& t, std::span<std::byte> rows) {
    wait(t);
    if (rows.empty()) return;
    if (cfg_.dtype != moe::DType::e4m3) {
      std::memcpy(rows.data(), t.data.data(), rows.size());
    } else {
      std::memset(rows.data(), 0, rows.size());
    }
  }

 private:
  void wait(const moe::ExpertTokens& t) {
    if (us_per_token_ > 0.0 && t.count > 0) {
#if UBEP_SIMGRID  // simulated compute: the time passes for this rank only, at no wall-time cost
      smpi_execute(us_per_token_ * static_cast<double>(t.count) * 1e-6);
#else
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
#endif
    }
  }
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

/// With Config::zero_copy (--outputs layer) the expert writes into expert_outputs and combine_send(h, e) sends them;
/// otherwise combine_send(h, e, outputs) copies the expert's own outputs.
template <class Expert>
Sample run_once(moe::LayerBase& layer, const Placed& in, Expert& expert, std::span<float> out) {
  const bool in_place = layer.config().zero_copy;
  const auto t0 = Clock::now();
  moe::Handle h = layer.dispatch_send(in.tokens, in.idx, in.weights, in.scales);
  std::optional<Clock::time_point> last_expert, first_combine;
  while (const std::optional<int> e = layer.next_expert(h)) {
    last_expert = Clock::now();
    const moe::ExpertTokens tokens = layer.expert_tokens(h, *e);
    if (in_place) {
      expert.into(tokens, layer.expert_outputs(h, *e));
      if (!first_combine) first_combine = Clock::now();
      layer.combine_send(h, *e);
      continue;
    }
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

/// The serial reference of one output element of token t under `cfg.combine` ("Combine modes" in
/// moe.hpp): y[a] are the expert outputs as read back (output_dtype), w[a] the weights, owner[a] the rank
/// of expert a, `me` the source rank.
float reference(const moe::Config& cfg, std::span<const float> y, std::span<const float> w, std::span<const int> owner,
                const std::vector<int>& node_of, int me) {
  const std::size_t topk = y.size();
  if (cfg.combine == moe::Combine::per_expert) {
    float acc = 0.0f;
    for (std::size_t a = 0; a < topk; ++a) acc += w[a] * y[a];
    return acc;
  }
  const moe::DType out_type = moe::output_dtype(cfg.dtype);
  const bool f32 = cfg.float_partials || out_type == moe::DType::f32;
  std::byte scratch[8];
  auto round = [&](float v) { return f32 ? v : store(out_type, scratch, 0, v); };
  std::vector<int> owners(owner.begin(), owner.end());
  std::sort(owners.begin(), owners.end());
  owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
  std::vector<int> nodes;
  for (const int o : owners) nodes.push_back(node_of[static_cast<std::size_t>(o)]);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  float out = 0.0f;
  for (const int n : nodes) {
    float node_row = 0.0f;
    for (const int o : owners) {
      if (node_of[static_cast<std::size_t>(o)] != n) continue;
      float partial = 0.0f;
      for (std::size_t a = 0; a < topk; ++a)
        if (owner[a] == o) partial += w[a] * y[a];
      node_row += round(partial);
    }
    out += n == node_of[static_cast<std::size_t>(me)] ? node_row : round(node_row);
  }
  return out;
}

/// Runs one call of every implementation with the arithmetic expert. Every ubep output must equal that
/// of the baseline of its combine mode (`bsp[s]`) bit for bit, and every baseline's must equal the serial
/// reference of its mode for a few tokens. Throws CheckFailed on every rank otherwise.
void check(const Comm& comm, const moe::Config& cfg, const Inputs& in, ubep::Context* gpu,
           const std::vector<moe::LayerBase*>& ubep, const std::vector<Variant>& variants,
           const std::vector<moe::LayerBase*>& bsp, const std::vector<int>& node_of, int check_tokens,
           const std::string& what) {
  const auto hidden = static_cast<std::size_t>(cfg.hidden);
  const auto topk = static_cast<std::size_t>(cfg.topk);
  const std::size_t n = static_cast<std::size_t>(in.n);
  ArithmeticExpert expert(cfg, gpu);
  std::vector<float> got(n * hidden);
  bool ok = true;
  // --memory device: inputs and sums in GPU memory, the sums read back through a host copy.
  const Placed placed(gpu, in);
  ubep::Symmetric<float> gpu_out;
  if (gpu != nullptr) gpu_out = gpu->alloc_device<float>(n * hidden);
  auto run_into = [&](moe::LayerBase& layer, std::vector<float>& dst) {
    if (gpu == nullptr) {
      run_once(layer, placed, expert, dst);
      return;
    }
    gpu->copy(gpu_out.data(), dst.data(), dst.size() * sizeof(float));  // what dst held (NaN for ubep)
    run_once(layer, placed, expert, std::span<float>(gpu_out.data(), dst.size()));
    gpu->copy(dst.data(), gpu_out.data(), dst.size() * sizeof(float));
  };

  // One baseline call per distinct BspLayer (per combine mode), in the same order on every rank.
  std::vector<moe::LayerBase*> baselines;
  for (moe::LayerBase* b : bsp)
    if (std::find(baselines.begin(), baselines.end(), b) == baselines.end()) baselines.push_back(b);
  std::vector<std::vector<float>> want(baselines.size(), std::vector<float>(n * hidden));
  for (std::size_t i = 0; i < baselines.size(); ++i) {
    comm.barrier();
    run_into(*baselines[i], want[i]);
  }
  for (std::size_t s = 0; s < ubep.size(); ++s) {
    const std::vector<float>& w =
        want[static_cast<std::size_t>(std::find(baselines.begin(), baselines.end(), bsp[s]) - baselines.begin())];
    std::fill(got.begin(), got.end(), std::nanf(""));
    comm.barrier();
    run_into(*ubep[s], got);
    if (std::memcmp(got.data(), w.data(), got.size() * sizeof(float)) != 0) {
      std::size_t i = 0;
      while (i < got.size() && std::memcmp(&got[i], &w[i], sizeof(float)) == 0) ++i;
      std::fprintf(stderr,
                   "check failed: rank %d, %s, route %s, schedule %s, combine %s: ubep output differs from bsp "
                   "(combine %s) at token %zu element %zu: ubep %.9g, bsp %.9g\n",
                   comm.rank(), what.c_str(), variants[s].route.c_str(), variants[s].schedule.c_str(),
                   variants[s].combine.c_str(), variants[s].combine.c_str(), i / hidden, i % hidden, got[i], w[i]);
      ok = false;
    }
  }

  // The serial reference of each baseline's mode: y(t,a) the expert output as read back, summed as "Combine
  // modes" in moe.hpp says (per_expert: out[t] = sum_a w[t,a] * y(t,a), a ascending).
  std::vector<std::size_t> picks;
  const std::size_t count = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(check_tokens, 1)));
  for (std::size_t i = 0; i < count; ++i) picks.push_back(count == 1 ? 0 : i * (n - 1) / (count - 1));
  const moe::DType out_type = moe::output_dtype(cfg.dtype);
  std::vector<std::byte> scratch(8);
  const std::size_t in_row = hidden * moe::element_size(cfg.dtype);
  std::vector<float> y(topk), w(topk);
  std::vector<int> owner(topk);
  for (std::size_t b = 0; b < baselines.size(); ++b) {
    const moe::Config& bc = baselines[b]->config();
    for (const std::size_t t : picks) {
      const float scale = cfg.dtype == moe::DType::e4m3 ? in.scales[t] : 1.0f;
      for (std::size_t k = 0; k < topk; ++k) {
        w[k] = in.weights[t * topk + k];
        owner[k] = baselines[b]->experts().owner(in.idx[t * topk + k]);
      }
      for (std::size_t j = 0; j < hidden && ok; ++j) {
        const float x = load(cfg.dtype, in.tokens.data() + t * in_row, j, scale);
        for (std::size_t k = 0; k < topk; ++k)
          y[k] = store(out_type, scratch.data(), 0, x * expert_factor(in.idx[t * topk + k]));
        const float acc = reference(bc, y, w, owner, node_of, comm.rank());
        if (!(acc == want[b][t * hidden + j])) {
          std::fprintf(stderr,
                       "check failed: rank %d, %s: bsp (combine %s) output of token %zu element %zu is %.9g, the "
                       "serial reference says %.9g\n",
                       comm.rank(), what.c_str(), moe::to_string(bc.combine), t, j, want[b][t * hidden + j], acc);
          ok = false;
        }
      }
    }
  }
  comm.agree(ok, "MoE outputs differ (" + what + "); see the messages above");
}

double median_of(const std::vector<Sample>& v, std::size_t metric) {
  std::vector<double> x;
  for (const Sample& s : v) x.push_back(s[metric]);
  return ubep::bench::median(std::move(x));
}

}  // namespace

void run_shape(const Args& a, const Comm& comm, const moe::Config& cfg, int iterations, int warmup,
               const std::vector<Variant>& variants, const std::vector<moe::LayerBase*>& ubep_layers,
               const std::vector<moe::LayerBase*>& bsp_check, moe::LayerBase& bsp_timed,
               const std::vector<int>& node_of, unsigned run_ahead, std::size_t heap, ubep::Context* gpu,
               const CopyBandwidth& copy, std::vector<std::pair<Result, Result>>& pairs, nlohmann::json& doc) {
  const int rank = comm.rank(), ranks = comm.size(), n = cfg.max_tokens_per_rank;
  const bool root = rank == 0;
  moe::LayerBase* bsp = &bsp_timed;
  bool several_routes = false;
  for (const Variant& v : variants) several_routes = several_routes || v.route != variants.front().route;
  std::vector<float> host_out(static_cast<std::size_t>(n) * static_cast<std::size_t>(a.hidden));
  std::span<float> out = host_out;
  ubep::Symmetric<float> gpu_out;  // --memory device: the sums in GPU memory
  if (gpu != nullptr) {
    gpu_out = gpu->alloc_device<float>(host_out.size());
    out = std::span<float>(gpu_out.data(), host_out.size());
  }
  for (const std::string& routing : a.routing) {
    const Inputs host_in = make_inputs(cfg, n, routing, a.zipf, rank);
    check(comm, cfg, host_in, gpu, ubep_layers, variants, bsp_check, node_of, a.check_tokens,
          fmt("%d tokens/rank, %s routing", n, routing.c_str()));
    const Placed in(gpu, host_in);

    for (const double compute : a.compute) {
      TimedExpert expert(cfg, compute, a.compute_mode == "sleep");
      std::vector<moe::LayerBase*> impls = ubep_layers;
      impls.push_back(bsp);
      std::vector<std::vector<Sample>> samples(impls.size());
      std::vector<moe::Traffic> before(impls.size());  // at the first timed iteration
      for (int it = 0; it < warmup + iterations; ++it) {
        if (it == warmup)
          for (std::size_t i = 0; i < impls.size(); ++i) before[i] = impls[i]->traffic();
        // Alternate who goes first, so that cache and scheduling effects of the order hit both alike.
        for (std::size_t k = 0; k < impls.size(); ++k) {
          const std::size_t i = it % 2 == 0 ? k : impls.size() - 1 - k;
          comm.barrier();
          Sample s = run_once(*impls[i], in, expert, out);
          comm.max(s);
          if (it >= warmup) samples[i].push_back(s);
        }
      }
      // Bytes per call over the timed iterations: [impl][column] per rank, then their sum and maximum over ranks.
      constexpr std::size_t kColumns = 4;
      std::vector<std::uint64_t> per_call(impls.size() * kColumns), sums, maxima;
      for (std::size_t i = 0; i < impls.size(); ++i) {
        const moe::Traffic& t = impls[i]->traffic();
        const std::uint64_t calls = std::max<std::uint64_t>(t.calls - before[i].calls, 1);
        const std::uint64_t delta[kColumns] = {
            t.dispatch_on_node - before[i].dispatch_on_node, t.dispatch_off_node - before[i].dispatch_off_node,
            t.combine_on_node - before[i].combine_on_node, t.combine_off_node - before[i].combine_off_node};
        for (std::size_t c = 0; c < kColumns; ++c) per_call[i * kColumns + c] = delta[c] / calls;
      }
      sums = maxima = per_call;
      comm.sum(sums);
      comm.max(maxima);
      // The floor: per implementation the most any rank sent in one call, plus the expert-output rows (n x topk,
      // each once) the weighted sums read.
      std::vector<std::uint64_t> sent(impls.size(), 0);
      for (std::size_t i = 0; i < impls.size(); ++i)
        for (std::size_t c = 0; c < kColumns; ++c) sent[i] += per_call[i * kColumns + c];
      comm.max(sent);
      const std::uint64_t reduce_reads = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(cfg.topk) *
                                         static_cast<std::uint64_t>(cfg.hidden) *
                                         moe::element_size(moe::output_dtype(cfg.dtype));
      auto bytes_at = [&](const std::vector<std::uint64_t>& v, std::size_t i, std::uint64_t divisor) {
        const auto d = [&](std::size_t c) { return (v[i * kColumns + c] + divisor / 2) / divisor; };
        return Bytes{d(0), d(1), d(2), d(3)};
      };
      std::vector<Result> results;
      for (std::size_t i = 0; i < impls.size(); ++i) {
        Result r;
        const bool ubep = i < variants.size();
        r.impl = impls[i]->name();
        r.route = ubep ? variants[i].route : kBspRoute;
        r.schedule = ubep ? variants[i].schedule : kBspSchedule;
        r.combine = ubep ? variants[i].combine : moe::to_string(impls[i]->config().combine);
        r.label = ubep ? "ubep/" + (several_routes ? r.route + "/" : std::string()) + r.schedule + "/" + r.combine
                       : std::string("bsp");
        r.mean = bytes_at(sums, i, static_cast<std::uint64_t>(ranks));
        r.max = bytes_at(maxima, i, 1);
        r.routing = routing;
        r.tokens = n;
        r.compute = compute;
        r.dispatch_us = median_of(samples[i], 0);
        r.combine_us = median_of(samples[i], 1);
        r.layer_us = median_of(samples[i], 2);
        r.buffer_bytes = comm.max(static_cast<std::uint64_t>(impls[i]->buffer_bytes()));
        r.floor_bytes = sent[i] + reduce_reads;
        r.floor_us = copy.bytes_per_us > 0.0 ? static_cast<double>(r.floor_bytes) / copy.bytes_per_us : 0.0;
        r.iterations = iterations;
        r.warmup = warmup;
        r.run_ahead = ubep ? run_ahead : 0;
        r.heap_bytes = ubep ? heap : 0;
        r.zero_copy = impls[i]->config().zero_copy;
        results.push_back(r);
      }
      const Result& b = results.back();
      for (std::size_t s = 0; s < variants.size(); ++s) pairs.emplace_back(results[s], b);
      if (root) {
        for (const Result& r : results) {
          print_row(a, r);
          doc["results"].push_back(to_json(a, ranks, r));
        }
        for (std::size_t s = 0; s < variants.size(); ++s) print_ratio(a, results[s], b);
        print_off_node_ratios(std::vector<Result>(results.begin(), results.end() - 1), b);
        std::fflush(stdout);
      }
    }
  }
}

CopyBandwidth measure_copy_bandwidth(const Comm& comm, std::size_t buffer_bytes, int repetitions) {
#if UBEP_SIMGRID  // simulated time does not count a memcpy, and every simulated rank's buffers share one process
  (void)comm, (void)buffer_bytes, (void)repetitions;
  return {};
#else
  std::vector<std::byte> src(buffer_bytes, std::byte{1}), dst(buffer_bytes, std::byte{0});
  std::memcpy(dst.data(), src.data(), buffer_bytes);  // every page touched before the timing
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    comm.barrier();
    const double t0 = MPI_Wtime();
    std::memcpy(dst.data(), src.data(), buffer_bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");  // the copy is used: no dead-store elimination
    double dt = MPI_Wtime() - t0;
    comm.max(std::span<double>(&dt, 1));
    times.push_back(dt);
  }
  const double t = ubep::bench::median(std::move(times));
  return {buffer_bytes, repetitions, t > 0.0 ? static_cast<double>(buffer_bytes) / (t * 1e6) : 0.0};
#endif
}

}  // namespace ubep::bench::moe_bench
