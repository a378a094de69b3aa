/// \file moe_bench.hpp
/// What the files of ubep_moe_bench (the benchmark is described in moe_bench_main.cpp) share: the settings
/// (Args), the benchmark's own communicator (Comm), one timed result (Result), and the functions called across
/// files: the run over the sizes (moe_bench_run.cpp), the timed cases (moe_bench_cases.cpp) and the reporting
/// (moe_bench_report.cpp).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bench/osu_harness.hpp"
#include "ubep/moe.hpp"

namespace ubep::bench::moe_bench {

constexpr double kMiB = 1024.0 * 1024.0;

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
  /// "default" (UBEP_TRANSPORTS as set), or mpi / ucx: UBEP_TRANSPORTS forced to self,shm,<route>. One
  /// Context per (route, schedule).
  std::vector<std::string> routes{"default"};
  /// moe::Config::combine modes to run (per_expert, per_rank, per_node): one Context per (route, schedule,
  /// mode), each checked against a moe::BspLayer of the same mode.
  /// automatic (the default mode) runs the mode moe::resolve_combine names on the job's node map, and an
  /// explicit entry of that same mode is dropped (it would time the same layer twice).
  std::vector<std::string> combine{"automatic", "per_expert", "per_node"};
  bool float_partials = false;  // --float-partials: Config::float_partials for every layer
  std::string memory = "host";  // --memory: Config::memory for every layer, inputs and sums in GPU memory
  /// --outputs: layer (the expert writes into expert_outputs, Config::zero_copy) or own (combine_send copies the
  /// expert's own buffer; the timed expert then writes nothing: its outputs are its input). Host memory only.
  std::string outputs = "layer";
  unsigned run_ahead = 0;   // 0: UBEP_RUN_AHEAD, lowered to 1 when the heap exceeds the budget
  std::string heap_budget;  // empty: a quarter of physical memory over the ranks of the node
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

std::string fmt(const char* format, auto... values) {
  char text[512];
  std::snprintf(text, sizeof text, format, values...);
  return text;
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
  std::uint64_t min(std::uint64_t v) const {
    UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_MIN, comm_));
    return v;
  }
  void max(std::span<std::uint64_t> v) const {
    UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT64_T, MPI_MAX, comm_));
  }
  void sum(std::span<std::uint64_t> v) const {
    UBEP_BENCH_MPI(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT64_T, MPI_SUM, comm_));
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

/// Every rank agrees that the run cannot do what was asked (e.g. --routes ucx with every peer on the
/// node); the job ends cleanly with exit status 2.
class Refused : public CheckFailed {
 public:
  using CheckFailed::CheckFailed;
};

// ---- results -----------------------------------------------------------------------------------------

/// One ubep Context of a shape: the route it reaches the peers off this node by (its label in rows, JSON
/// and summary: the forced route, or for "default" the farthest route any rank uses), its schedule, and the
/// Config::combine mode of its Layer.
struct Variant {
  std::string route, schedule, combine;
};

/// Bytes sent to other ranks (LayerBase::traffic()), in the order of the table's columns.
struct Bytes {
  std::uint64_t dispatch_on_node = 0, dispatch_off_node = 0, combine_on_node = 0, combine_off_node = 0;
  std::uint64_t off_node() const { return dispatch_off_node + combine_off_node; }
};
inline Bytes bytes_of(const moe::Traffic& t) {
  return {t.dispatch_on_node, t.dispatch_off_node, t.combine_on_node, t.combine_off_node};
}

struct Result {
  std::string impl, route, schedule, combine, routing;
  /// "ubep/<schedule>/<combine>" ("ubep/<route>/<schedule>/<combine>" when the run has several routes),
  /// "bsp"
  std::string label;
  int tokens = 0;
  double compute = 0.0;
  double dispatch_us = 0.0, combine_us = 0.0, layer_us = 0.0;
  std::uint64_t buffer_bytes = 0;
  int iterations = 0, warmup = 0;
  unsigned run_ahead = 0;
  std::size_t heap_bytes = 0;
  bool zero_copy = false;  // the layer's Config::zero_copy (--outputs layer, within the heap budget)
  /// Per call and rank over the timed iterations: the mean over ranks (rounded to whole bytes) and the
  /// maximum over ranks.
  Bytes mean, max;
  /// The memory floor of this implementation's call (floor_bytes ÷ the copy bandwidth, docs/MOE_BENCH.md):
  /// the most any rank sent (all four byte columns) plus the expert-output rows its reduction reads.
  std::uint64_t floor_bytes = 0;
  double floor_us = 0.0;  // 0: no copy bandwidth measured (SimGrid)
};

/// The memory bandwidth of a plain copy (memcpy of buffers far beyond the caches) with every rank of the job
/// copying at once: bytes copied per microsecond by one rank, the slowest rank's time, median of the repetitions;
/// 0 under SimGrid (not measured).
struct CopyBandwidth {
  std::size_t buffer_bytes = 0;
  int repetitions = 0;
  double bytes_per_us = 0.0;
};

// ---- the run (moe_bench_run.cpp) --------------------------------------------------------------------

/// Collective: runs every size of `a` (its cases through run_shape), prints the header, the rows and the
/// summary from rank 0 and writes the JSON file. Returns 0; throws CheckFailed (every rank) on a wrong result,
/// Refused (every rank) when --routes cannot be honoured, anything else on one rank alone.
int run(const Args& a, const Comm& comm);

// ---- the cases (moe_bench_cases.cpp) -----------------------------------------------------------------

/// All routings and compute costs of one size: check, then time every implementation interleaved.
/// `variants[i]` names `ubep_layers[i]`; `bsp_check[i]` is the moe::BspLayer of its combine mode, which
/// its outputs must equal; `bsp_timed` the BspLayer of the timed bsp rows (per_expert). `node_of`: every
/// rank's Topology::node_of (the serial reference of per_rank and per_node). `gpu` (--memory device): the
/// Context whose GPU heap holds the inputs and sums (the layers have Config::memory device); null for host.
void run_shape(const Args& a, const Comm& comm, const moe::Config& cfg, int iterations, int warmup,
               const std::vector<Variant>& variants, const std::vector<moe::LayerBase*>& ubep_layers,
               const std::vector<moe::LayerBase*>& bsp_check, moe::LayerBase& bsp_timed,
               const std::vector<int>& node_of, unsigned run_ahead, std::size_t heap, ubep::Context* gpu,
               const CopyBandwidth& copy, std::vector<std::pair<Result, Result>>& pairs, nlohmann::json& doc);
/// Collective: measures CopyBandwidth (buffer_bytes per rank, each rank's two buffers its own).
CopyBandwidth measure_copy_bandwidth(const Comm& comm, std::size_t buffer_bytes, int repetitions);

// ---- reporting (moe_bench_report.cpp) ----------------------------------------------------------------

void print_columns();
void print_row(const Args& a, const Result& r);
void print_ratio(const Args& a, const Result& u, const Result& b);
/// One comment line per case: off-node bytes (dispatch + combine, mean over ranks) ubep/bsp per variant.
void print_off_node_ratios(const std::vector<Result>& ubep, const Result& b);
/// "12.3 KiB"-style text of a byte count (B, KiB, MiB, GiB).
std::string human_bytes(double bytes);
nlohmann::json to_json(const Args& a, int ranks, const Result& r);
/// The closing lines: our best reduction next to the UBEP paper's figures, and the whole range.
std::vector<std::string> summarize(const std::vector<std::pair<Result, Result>>& pairs, nlohmann::json& out);
/// Rank 0, after MPI_Finalize: renders the plot with bench/moe_plot.py (Debian's python3 has matplotlib,
/// a pyenv python3 first on PATH may not).
int plot(const Args& a);

}  // namespace ubep::bench::moe_bench
