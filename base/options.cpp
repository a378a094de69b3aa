#include "ubep/options.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "ubep/config.hpp"
#include "ubep/error.hpp"

namespace ubep {
namespace {

[[noreturn]] void bad(const char* what, const std::string& value, const std::string& why) {
  throw Error(Errc::invalid_argument, std::string("ubep: ") + what + "='" + value + "': " + why);
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::uint64_t parse_uint(const std::string& text, const char* what) {
  std::string t = trim(text);
  if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) bad(what, text, "expected a non-negative integer");
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (errno == ERANGE || end != t.c_str() + t.size()) bad(what, text, "expected a non-negative integer");
  return v;
}

std::uint32_t parse_u32(const std::string& text, const char* what) {
  std::uint64_t v = parse_uint(text, what);
  if (v > 0xffffffffULL) bad(what, text, "value too large");
  return static_cast<std::uint32_t>(v);
}

bool parse_bool(const std::string& text, const char* what) {
  std::string t = trim(text);
  if (t == "1" || t == "yes" || t == "true" || t == "on") return true;
  if (t == "0" || t == "no" || t == "false" || t == "off" || t.empty()) return false;
  bad(what, text, "expected 0 or 1");
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) {
    item = trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

std::size_t parse_size(const std::string& text, const char* what) {
  std::string t = trim(text);
  std::size_t shift = 0;
  if (!t.empty()) {
    switch (std::toupper(static_cast<unsigned char>(t.back()))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: break;
    }
    if (shift) t.pop_back();
    if (!t.empty() && (t.back() == 'i' || t.back() == 'I')) bad(what, text, "use K, M, G or T (powers of 2)");
  }
  std::uint64_t v = parse_uint(t, what);
  if (shift && v > (~std::uint64_t{0} >> shift)) bad(what, text, "size overflows 64 bits");
  return static_cast<std::size_t>(v << shift);
}

PollPolicy PollPolicy::parse(const std::string& text) {
  PollPolicy p;
  std::string t = trim(text);
  if (t.empty() || t == "adaptive") return p;
  if (t == "spin") {
    p.spin = 0xffffffffu;
    p.yield = 0;
    return p;
  }
  if (t == "yield") {
    p.spin = 0;
    p.yield = 0xffffffffu;
    return p;
  }
  for (const std::string& kv : split(t, ',')) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) bad("UBEP_POLL", text, "expected adaptive, spin, yield or key=value pairs");
    std::string key = trim(kv.substr(0, eq));
    std::string val = kv.substr(eq + 1);
    if (key == "spin")
      p.spin = parse_u32(val, "UBEP_POLL spin");
    else if (key == "yield")
      p.yield = parse_u32(val, "UBEP_POLL yield");
    else if (key == "sleep_max_us")
      p.sleep_max_us = parse_u32(val, "UBEP_POLL sleep_max_us");
    else if (key == "progress_every")
      p.progress_every = parse_u32(val, "UBEP_POLL progress_every");
    else
      bad("UBEP_POLL", text, "unknown key '" + key + "' (spin, yield, sleep_max_us, progress_every)");
  }
  if (p.progress_every == 0) bad("UBEP_POLL", text, "progress_every must be at least 1");
  return p;
}

std::vector<std::string> Options::default_transports() {
  if (UBEP_SIMGRID) return {"self", "mpi"};  // every byte between ranks crosses the simulated network
  if (UBEP_HAVE_UCX) return {"self", "shm", "ucx", "mpi"};
  return {"self", "shm", "mpi"};
}

const char* to_string(ScheduleKind k) noexcept {
  switch (k) {
    case ScheduleKind::linear: return "linear";
    case ScheduleKind::shifted: return "shifted";
    case ScheduleKind::topology: return "topology";
  }
  return "?";
}
const char* to_string(UcxMode m) noexcept {
  switch (m) {
    case UcxMode::automatic: return "auto";
    case UcxMode::am: return "am";
    case UcxMode::rdma: return "rdma";
  }
  return "?";
}
const char* to_string(ProgressThread p) noexcept {
  switch (p) {
    case ProgressThread::automatic: return "auto";
    case ProgressThread::on: return "1";
    case ProgressThread::off: return "0";
  }
  return "?";
}
const char* to_string(MpiSignal m) noexcept {
  switch (m) {
    case MpiSignal::put: return "put";
    case MpiSignal::accumulate: return "accumulate";
    case MpiSignal::message: return "message";
  }
  return "?";
}
const char* to_string(MpiBounded m) noexcept {
  switch (m) {
    case MpiBounded::automatic: return "auto";
    case MpiBounded::all: return "all";
    case MpiBounded::off: return "off";
  }
  return "?";
}
const char* to_string(GpuMpiWindow w) noexcept {
  switch (w) {
    case GpuMpiWindow::automatic: return "auto";
    case GpuMpiWindow::on: return "1";
    case GpuMpiWindow::off: return "0";
  }
  return "?";
}
const char* to_string(MoeKernels k) noexcept {
  switch (k) {
    case MoeKernels::automatic: return "auto";
    case MoeKernels::portable: return "portable";
    case MoeKernels::avx2: return "avx2";
    case MoeKernels::avx512: return "avx512";
  }
  return "?";
}

namespace {

// Codecs: one per type of setting. Each says how the docs name its type, parses a variable's text (throwing
// bad() with the variable's name) and writes a value back in the form the variable takes.
struct SizeCodec {
  static std::string type() { return "size (K, M, G, T: powers of 2)"; }
  static std::size_t parse(const std::string& text, const char* name) {
    const std::size_t v = parse_size(text, name);
    if (v == 0) bad(name, text, "must be positive");
    return v;
  }
  static std::string show(std::size_t v) {
    const char* suffix = "KMGT";
    int unit = -1;
    while (unit < 3 && v != 0 && v % 1024 == 0) {
      v /= 1024;
      ++unit;
    }
    return std::to_string(v) + (unit >= 0 ? std::string(1, suffix[unit]) : "");
  }
};

struct EagerCodec {
  static std::string type() { return "size or auto"; }
  static std::size_t parse(const std::string& text, const char* name) {
    return trim(text) == "auto" ? kUcxEagerAuto : parse_size(text, name);
  }
  static std::string show(std::size_t v) { return v == kUcxEagerAuto ? "auto" : SizeCodec::show(v); }
};

struct SecondsCodec {
  static std::string type() { return "seconds"; }
  static std::chrono::duration<double> parse(const std::string& text, const char* name) {
    const std::string t = trim(text);
    char* end = nullptr;
    const double s = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(s) || s < 0) {
      bad(name, text, "expected seconds >= 0");
    }
    return std::chrono::duration<double>(s);
  }
  static std::string show(std::chrono::duration<double> v) {
    char text[32];  // %.17g reads back as the same double (std::to_string printed 1e-7 as 0.000000: "never")
    std::snprintf(text, sizeof text, "%.17g", v.count());
    return text;
  }
};

template <std::uint32_t Min, std::uint32_t Max>
struct CountCodec {
  static std::string type() {
    return Max == 0xffffffffu ? "integer" : "integer " + std::to_string(Min) + ".." + std::to_string(Max);
  }
  static std::uint32_t parse(const std::string& text, const char* name) {
    const std::uint32_t v = parse_u32(text, name);
    if (v < Min || v > Max) bad(name, text, "expected " + std::to_string(Min) + ".." + std::to_string(Max));
    return v;
  }
  static std::string show(std::uint32_t v) { return std::to_string(v); }
};

struct BoolCodec {
  static std::string type() { return "0 or 1"; }
  static bool parse(const std::string& text, const char* name) { return parse_bool(text, name); }
  static std::string show(bool v) { return v ? "1" : "0"; }
};

struct PollCodec {
  static std::string type() { return "adaptive, spin, yield or key=value,..."; }
  static PollPolicy parse(const std::string& text, const char*) { return PollPolicy::parse(text); }
  static std::string show(const PollPolicy& p) {
    return "spin=" + std::to_string(p.spin) + ",yield=" + std::to_string(p.yield) +
           ",sleep_max_us=" + std::to_string(p.sleep_max_us) + ",progress_every=" + std::to_string(p.progress_every);
  }
};

struct TransportsCodec {
  static std::string type() { return "list of self, shm, ucx, mpi"; }
  static std::vector<std::string> parse(const std::string& text, const char* name) {
    std::vector<std::string> out = split(text, ',');
    for (const std::string& t : out) {
      if (t != "self" && t != "shm" && t != "mpi" && t != "ucx") {
        bad(name, text, "unknown transport '" + t + "' (self, shm, mpi, ucx)");
      }
    }
    if (out.empty()) bad(name, text, "no transport named");
    return out;
  }
  static std::string show(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  }
};

template <bool Trim>
struct TextCodec {
  static std::string type() { return Trim ? "text" : "path"; }
  static std::string parse(const std::string& text, const char*) { return Trim ? trim(text) : text; }
  static std::string show(const std::string& v) { return v; }
};

template <class E, E... Values>
struct ChoiceCodec {
  // The names of the choices, "a, b<last>c".
  static std::string names(const char* last) {
    std::string out;
    std::size_t i = 0;
    for (const E v : {Values...}) {
      out += (i == 0 ? "" : i + 1 == sizeof...(Values) ? last : ", ") + std::string(to_string(v));
      ++i;
    }
    return out;
  }
  static std::string type() { return "one of " + names(", "); }
  static E parse(const std::string& text, const char* name) {
    const std::string t = trim(text);
    for (const E v : {Values...}) {
      if (t == to_string(v)) return v;
    }
    bad(name, text, "expected " + names(" or "));
  }
  static std::string show(E v) { return to_string(v); }
};

using ScheduleCodec = ChoiceCodec<ScheduleKind, ScheduleKind::linear, ScheduleKind::shifted, ScheduleKind::topology>;
using UcxModeCodec = ChoiceCodec<UcxMode, UcxMode::automatic, UcxMode::am, UcxMode::rdma>;
using ProgressCodec = ChoiceCodec<ProgressThread, ProgressThread::automatic, ProgressThread::on, ProgressThread::off>;
using MpiSignalCodec = ChoiceCodec<MpiSignal, MpiSignal::put, MpiSignal::accumulate, MpiSignal::message>;
using MpiBoundedCodec = ChoiceCodec<MpiBounded, MpiBounded::automatic, MpiBounded::all, MpiBounded::off>;
using GpuWindowCodec = ChoiceCodec<GpuMpiWindow, GpuMpiWindow::automatic, GpuMpiWindow::on, GpuMpiWindow::off>;
using KernelsCodec =
    ChoiceCodec<MoeKernels, MoeKernels::automatic, MoeKernels::portable, MoeKernels::avx2, MoeKernels::avx512>;

// One row: the field, its codec and what the docs say. The type string lives as long as the table.
template <auto Field, class Codec>
Setting row(const char* name, bool collective, bool testing, const char* meaning) {
  static const std::string type = Codec::type();
  return Setting{name,
                 type.c_str(),
                 collective,
                 testing,
                 meaning,
                 [](const Options& o) { return Codec::show(o.*Field); },
                 [](Options& o, const std::string& text, const char* n) { o.*Field = Codec::parse(text, n); }};
}

constexpr bool kCollective = true, kLocal = false, kTesting = true, kUse = false;

// The settings table: the one definition of every UBEP_* variable. docs/SETTINGS.md is generated from it
// (ubep-info --settings-table; the test docs.settings fails when they differ).
const std::vector<Setting>& table() {
  static const std::vector<Setting> rows = {
      row<&Options::heap_size, SizeCodec>("UBEP_HEAP_SIZE", kCollective, kUse,
                                          "symmetric heap per rank, in bytes; rounded up to 4 KiB"),
      row<&Options::wait_timeout, SecondsCodec>(
          "UBEP_WAIT_TIMEOUT", kLocal, kUse,
          "seconds any wait, ubep collective or (as `UBEP_MPI_BOUNDED` says) blocking MPI call of the `mpi` route "
          "may block before it throws `Errc::timeout`, naming the peers and signals it waited for; `0` = never "
          "(blocking MPI calls then run inline)"),
      row<&Options::poll, PollCodec>(
          "UBEP_POLL", kLocal, kUse,
          "how every wait polls: `adaptive` (spin 256, yield 4096, then sleep up to 64 µs), `spin` (dedicated "
          "cores), `yield`, or `spin=N,yield=M,sleep_max_us=K,progress_every=P` (any subset; while spinning, "
          "MPI is called every `progress_every` polls)"),
      row<&Options::transports, TransportsCodec>(
          "UBEP_TRANSPORTS", kCollective, kUse,
          "transports the route table may use: each peer gets the first of `self` (this rank), `shm` (same "
          "node), `ucx`, `mpi` that is named and reaches it, so off-node peers go over UCX whenever `ucx` is "
          "named. Default `self,shm,ucx,mpi` in builds with UCX, `self,shm,mpi` without, `self,mpi` in SimGrid "
          "builds (shared memory is not simulated). `self,shm,mpi` forces MPI RMA off the node, `mpi` alone "
          "sends every operation, to self too, through MPI RMA, `ucx` alone through UCX (docs/ROUTES.md)"),
      row<&Options::ucx_mode, UcxModeCodec>(
          "UBEP_UCX_MODE", kCollective, kUse,
          "how the `ucx` route moves data to each peer: `auto` = `rdma` where the endpoint has one lane with "
          "hardware RMA and atomics (InfiniBand/RoCE), `am` (active messages) elsewhere (TCP, shared memory); "
          "`am` or `rdma` force one for every peer (`rdma` without such a lane is emulated by UCX in software, "
          "needs the target's progress and is slower than `am`: for testing)"),
      row<&Options::ucx_eager_max, EagerCodec>(
          "UBEP_UCX_EAGER_MAX", kLocal, kUse,
          "the largest payload the `ucx` route sends eager (`am` mode: one message, copied once out of UCX's "
          "receive buffer); a larger one goes by rendezvous (the target receives it straight into its heap after "
          "a round trip). `auto` leaves the choice to UCX's thresholds (`UCX_RNDV_THRESH`), which over TCP go "
          "rendezvous from about 20 KiB, below Open MPI's 64 KiB eager limit (docs/MULTINODE.md, \"The `ucx` "
          "route by size\")"),
      row<&Options::progress_thread, ProgressCodec>(
          "UBEP_PROGRESS_THREAD", kCollective, kUse,
          "`auto`: where UCX is in use (a peer on the `ucx` route), a thread that answers the peers' UCX "
          "messages (data, signals, atomics, gets, flushes) and drives the staged GPU route while the "
          "application computes or sits in a plain MPI call; it calls no MPI and sleeps on UCX's event fd when "
          "the job idles. `1`: a thread that also calls into MPI every `UBEP_PROGRESS_INTERVAL_US` (needs "
          "`MPI_THREAD_MULTIPLE`), for the `mpi` route. `0`: none (a rank's own ubep calls are its only progress)"),
      row<&Options::progress_interval_us, CountCodec<0, 0xffffffffu>>(
          "UBEP_PROGRESS_INTERVAL_US", kLocal, kUse,
          "how often, in microseconds, the thread of `UBEP_PROGRESS_THREAD=1` calls into MPI; where ranks "
          "outnumber cores, 1000 or more (docs/MULTINODE.md, \"Known problems\")"),
      row<&Options::gpu, BoolCodec>(
          "UBEP_GPU", kCollective, kUse,
          "`1` initializes CUDA when a Context is created; where a rank has no usable GPU every rank's "
          "`Context()` fails together (`Errc::unsupported`, naming the rank and CUDA's answer). `0`: ubep "
          "leaves CUDA untouched until something asks for a GPU (`ubep::gpu_status()`)"),
      row<&Options::gpu_heap_size, SizeCodec>(
          "UBEP_GPU_HEAP_SIZE", kCollective, kUse,
          "bytes of symmetric GPU heap per rank, created by the first `alloc_device` on the current CUDA device "
          "(nothing is allocated on a GPU before); rounded up to the device's allocation granularity"),
      row<&Options::gpu_staging_chunk, SizeCodec>(
          "UBEP_GPU_STAGING_CHUNK", kCollective, kUse,
          "bytes per chunk of the staged route (GPU-heap puts and gets to other nodes: device → host → host "
          "route → host → device, 2 chunks in flight per pair of ranks); its buffers come out of the host heap, "
          "4 chunks per rank of the job, when the job spans nodes"),
      row<&Options::gpu_mpi_window, GpuWindowCodec>(
          "UBEP_GPU_MPI_WINDOW", kCollective, kUse,
          "how GPU-heap data reaches ranks of other nodes: `auto` an MPI window over the GPU heap (`MPI_Put`/"
          "`MPI_Get` with device addresses) when every rank's MPI says it is CUDA-aware "
          "(`MPIX_Query_cuda_support()` = 1), else the staged route; `1` the window always (an MPI that is "
          "CUDA-aware without the query, or testing with `UBEP_GPU_EMULATE=1`; refused with a real GPU heap "
          "when the MPI says 0); `0` the staged route always"),
      row<&Options::schedule, ScheduleCodec>(
          "UBEP_SCHEDULE", kLocal, kUse,
          "the order of peers in all-to-all traffic: `topology` (far distance classes first, staggered by rank "
          "inside each class), `shifted` ((rank + i) mod n) or `linear` (every rank starts at rank 0)"),
      row<&Options::topology_file, TextCodec<false>>(
          "UBEP_TOPOLOGY_FILE", kCollective, kUse,
          "a Slurm `topology.conf` giving switch-level distances between nodes; ranks agree on its contents "
          "(empty: none)"),
      row<&Options::topology_probe, BoolCodec>(
          "UBEP_TOPOLOGY_PROBE", kCollective, kUse,
          "`1` refines the cost matrix with a measured ping-pong per distance class"),
      row<&Options::run_ahead, CountCodec<1, 64>>(
          "UBEP_RUN_AHEAD", kLocal, kUse,
          "MoE: how many calls a rank may run ahead of its slowest peer (buffer sets); a layer agrees on it "
          "with its peers when it is created"),
      row<&Options::mpi_signal, MpiSignalCodec>(
          "UBEP_MPI_SIGNAL", kCollective, kUse,
          "how a signal travels on the `mpi` route: `put` (a `set` is an 8-byte `MPI_Put` after the flush that "
          "completes the data; `add` is `MPI_Accumulate`), `accumulate` (`MPI_Accumulate`, `MPI_REPLACE` or "
          "`MPI_SUM`), or `message` (every signal an `MPI_Isend` of 24 bytes after that flush, applied by the "
          "target when it next calls ubep; the default in SimGrid builds). docs/ROUTES.md, \"Signals as "
          "messages\""),
      row<&Options::mpi_bounded, MpiBoundedCodec>(
          "UBEP_MPI_BOUNDED", kLocal, kUse,
          "which blocking MPI calls of the `mpi` route get the `UBEP_WAIT_TIMEOUT` deadline (on a worker "
          "thread): `auto` = every call to a peer on the `mpi` route (this host's too: its puts complete only "
          "with its progress) and fetching atomics to any peer; accumulates and flushes to mapped (`shm`) peers "
          "run inline; `all` = every call (UCX without shared memory on one host, e.g. `UCX_TLS=tcp,self`); "
          "`off` = none (inline: a stalled peer blocks the caller forever)"),
      row<&Options::moe_kernels, KernelsCodec>(
          "UBEP_MOE_KERNELS", kLocal, kUse,
          "MoE: the row kernels of the reductions and bf16 rounding, for the process (the first MoE layer, or "
          "the first kernel call, picks them): `auto` the fastest the CPU runs (`avx512`: AVX-512F, else "
          "`avx2`, else `portable`), or one of those forced (a path the CPU lacks: `Errc::unsupported`). Every "
          "path gives bit-identical outputs; `moe::kernels()` says which runs"),
      row<&Options::moe_relay_thread, BoolCodec>(
          "UBEP_MOE_RELAY_THREAD", kLocal, kUse,
          "MoE, `per_node` across nodes: `1` gives each layer a thread that runs the rank's relay work (forwards, "
          "node rows) while calls are in flight and the application is outside the layer, so a rank that computes "
          "or blocks in MPI still serves the sources it relays for; the application must then not call the "
          "`Context` between a `dispatch_send` and its `combine_recv` (docs/MOE.md, \"The relay thread\"). `0`: "
          "relay work runs inside layer calls and `Layer::progress()`"),
      row<&Options::gpu_emulate, BoolCodec>(
          "UBEP_GPU_EMULATE", kCollective, kTesting,
          "`1` makes the GPU heap shared host memory standing in for device memory (copies are `memcpy`, node "
          "peers map it through the same fd exchange as CUDA's fd handles), on any machine, so `alloc_device` "
          "and every call on GPU addresses run without a GPU; everything that describes the heap says "
          "EMULATING"),
      row<&Options::virtual_nodes, TextCodec<true>>(
          "UBEP_VIRTUAL_NODES", kCollective, kTesting,
          "split the ranks of each real node into emulated nodes: `N` = N nodes of consecutive ranks, "
          "`0,1|2,3` = explicit rank lists; ranks on different emulated nodes use the off-node route (`ucx` in "
          "builds with UCX, else `mpi`) and see `node` or farther distances; every output that depends on it "
          "says that it is emulated (empty: off)"),
  };
  return rows;
}

}  // namespace

std::span<const Setting> settings() noexcept { return table(); }

ScheduleKind parse_schedule(std::string_view name) { return ScheduleCodec::parse(std::string(name), "UBEP_SCHEDULE"); }

const Setting& setting(std::string_view name) {
  for (const Setting& s : table()) {
    if (name == s.name) return s;
  }
  throw Error(Errc::invalid_argument,
              "ubep: '" + std::string(name) + "' is not a UBEP_* setting (ubep-info --settings)");
}

bool Setting::read_env(Options& o) const {
  const char* v = env(name);
  if (v) parse(o, v);
  return v != nullptr;
}

Options Options::from_env() {
  Options o;
  for (const Setting& s : table()) s.read_env(o);
  return o;
}

std::vector<std::string> Options::describe() const {
  std::vector<std::string> out;
  for (const Setting& s : table()) out.push_back(std::string(s.name) + "=" + s.value(*this));
  return out;
}

}  // namespace ubep
