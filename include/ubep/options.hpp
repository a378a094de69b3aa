/// \file options.hpp
/// Every setting of ubep in one struct, read once from the environment (UBEP_*), and the table that defines
/// each variable once. A program may also build an Options by hand and pass it to the Context. All ranks
/// must use the same values for the settings marked "collective"; Context() checks them and throws otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ubep/config.hpp"

namespace ubep {

/// How a wait polls: spin with a CPU pause, then yield the core, then sleep in doubling steps.
struct PollPolicy {
  std::uint32_t spin = 256;         ///< polls with a pause instruction before yielding
  std::uint32_t yield = 4096;       ///< polls with sched_yield() before sleeping
  std::uint32_t sleep_max_us = 64;  ///< the longest sleep between polls once sleeping, in microseconds
  /// While spinning, call into MPI (Win_sync + Iprobe) every this many polls; once yielding or
  /// sleeping, every poll calls into MPI.
  std::uint32_t progress_every = 32;
  /// Parses UBEP_POLL: "adaptive" (the default above), "spin" (never yield: dedicated cores), "yield"
  /// (spin 0, yield forever), or "spin=N,yield=M,sleep_max_us=K,progress_every=P" (any subset).
  static PollPolicy parse(const std::string& text);
  bool operator==(const PollPolicy&) const = default;
};

/// The order in which a rank serves its peers in an all-to-all.
enum class ScheduleKind : std::uint8_t {
  linear,    ///< 0, 1, ..., n-1 for every rank: everyone hits rank 0 first (the incast baseline)
  shifted,   ///< (rank + i) mod n
  topology,  ///< far distance classes first, staggered by rank inside each class
};
const char* to_string(ScheduleKind k) noexcept;
/// Parses "linear", "shifted", "topology"; throws ubep::Error (invalid_argument) otherwise (UBEP_SCHEDULE).
ScheduleKind parse_schedule(std::string_view name);

/// UBEP_UCX_MODE: how the ucx route moves data to each peer.
enum class UcxMode : std::uint8_t {
  automatic,  ///< "auto": rdma where the endpoint has a lane with hardware RMA and atomics, am elsewhere
  am,         ///< active messages to every peer
  rdma,       ///< put, fence and atomics to every peer (emulated by UCX in software without such a lane)
};
/// UBEP_UCX_EAGER_MAX=auto: UCX chooses eager or rendezvous per message by its own thresholds (UCX_RNDV_THRESH).
inline constexpr std::size_t kUcxEagerAuto = ~std::size_t{0};
/// UBEP_PROGRESS_THREAD: which progress thread runs beside the application.
enum class ProgressThread : std::uint8_t {
  automatic,  ///< "auto": where a peer is on the ucx route, a thread that sleeps on UCX's event fd (no MPI)
  on,         ///< "1": a thread that also calls into MPI every progress_interval_us (needs MPI_THREAD_MULTIPLE)
  off,        ///< "0": none; a rank's own ubep calls are its only progress
};
/// UBEP_MPI_SIGNAL: how a signal travels on the mpi route.
enum class MpiSignal : std::uint8_t {
  put,         ///< a set is an 8-byte MPI_Put after the flush that completes the data; add is MPI_Accumulate
  accumulate,  ///< MPI_Accumulate (MPI_REPLACE or MPI_SUM)
  message,     ///< an MPI_Isend of {offset, op, value} after that flush, applied when the target calls ubep
};
/// UBEP_MPI_BOUNDED: which blocking MPI calls of the mpi route get the wait deadline.
enum class MpiBounded : std::uint8_t {
  automatic,  ///< "auto": calls to peers on the mpi route and fetching atomics to any peer
  all,        ///< every call
  off,        ///< none: every call inline, unbounded
};
/// UBEP_GPU_MPI_WINDOW: how GPU-heap data reaches ranks of other nodes.
enum class GpuMpiWindow : std::uint8_t {
  automatic,  ///< "auto": an MPI window over the GPU heap when every rank's MPI is CUDA-aware, else staged
  on,         ///< "1": the window always
  off,        ///< "0": the staged route always
};
/// UBEP_MOE_KERNELS: the MoE row kernels of the process (moe::kernels() says which runs).
enum class MoeKernels : std::uint8_t { automatic, portable, avx2, avx512 };

/// The name each value takes in its variable ("auto", "am", "1", ...).
const char* to_string(UcxMode m) noexcept;
const char* to_string(ProgressThread p) noexcept;  ///< "auto", "1", "0"
const char* to_string(MpiSignal m) noexcept;
const char* to_string(MpiBounded m) noexcept;
const char* to_string(GpuMpiWindow w) noexcept;  ///< "auto", "1", "0"
const char* to_string(MoeKernels k) noexcept;

/// The settings of a Context, one field per UBEP_* variable. Each variable is defined once, in the settings
/// table (settings() below, docs/SETTINGS.md): its type, default, meaning, whether every rank must agree
/// (Context() checks those and throws Errc::collective_mismatch naming the variable) and whether it is for
/// testing. The defaults below are the table's defaults.
struct Options {
  std::size_t heap_size = std::size_t{256} << 20;              ///< UBEP_HEAP_SIZE (collective)
  std::chrono::duration<double> wait_timeout{300.0};           ///< UBEP_WAIT_TIMEOUT; 0 = never
  PollPolicy poll{};                                           ///< UBEP_POLL; see PollPolicy::parse
  std::vector<std::string> transports = default_transports();  ///< UBEP_TRANSPORTS (collective)
  UcxMode ucx_mode = UcxMode::automatic;                       ///< UBEP_UCX_MODE (collective)
  std::size_t ucx_eager_max = std::size_t{1} << 20;            ///< UBEP_UCX_EAGER_MAX; kUcxEagerAuto: UCX chooses
  ProgressThread progress_thread = ProgressThread::automatic;  ///< UBEP_PROGRESS_THREAD (collective)
  std::uint32_t progress_interval_us = 50;                     ///< UBEP_PROGRESS_INTERVAL_US
  bool gpu = false;                                            ///< UBEP_GPU (collective)
  std::size_t gpu_heap_size = std::size_t{1} << 30;            ///< UBEP_GPU_HEAP_SIZE (collective)
  std::size_t gpu_staging_chunk = std::size_t{64} << 10;       ///< UBEP_GPU_STAGING_CHUNK (collective)
  GpuMpiWindow gpu_mpi_window = GpuMpiWindow::automatic;       ///< UBEP_GPU_MPI_WINDOW (collective)
  ScheduleKind schedule = ScheduleKind::topology;              ///< UBEP_SCHEDULE
  std::string topology_file;                                   ///< UBEP_TOPOLOGY_FILE (collective: contents)
  bool topology_probe = false;                                 ///< UBEP_TOPOLOGY_PROBE (collective)
  std::uint32_t run_ahead = 2;                                 ///< UBEP_RUN_AHEAD (MoE buffer sets)
  MpiSignal mpi_signal = UBEP_SIMGRID ? MpiSignal::message : MpiSignal::put;  ///< UBEP_MPI_SIGNAL (collective)
  MpiBounded mpi_bounded = MpiBounded::automatic;                             ///< UBEP_MPI_BOUNDED
  MoeKernels moe_kernels = MoeKernels::automatic;                             ///< UBEP_MOE_KERNELS (read per process)
  bool moe_relay_thread = false;                                              ///< UBEP_MOE_RELAY_THREAD
  // For testing (the table's "testing" rows):
  bool gpu_emulate = false;   ///< UBEP_GPU_EMULATE (collective, testing)
  std::string virtual_nodes;  ///< UBEP_VIRTUAL_NODES (collective, testing)

  /// The transports of a default Options: "self,shm,ucx,mpi" in builds with UCX, "self,mpi" in SimGrid
  /// builds, else "self,shm,mpi".
  static std::vector<std::string> default_transports();
  /// Reads every UBEP_* variable of the table once (unset or empty: the default). Throws
  /// Errc::invalid_argument naming the variable and the value when one cannot be parsed.
  static Options from_env();
  /// The settings as "NAME=value" lines in the table's order, each value in the form its variable takes
  /// (from_env() reads them back to equal settings), for ubep-info and benchmark headers.
  std::vector<std::string> describe() const;
  bool operator==(const Options&) const = default;
};

/// One row of the settings table: the one definition of a UBEP_* variable. Options::from_env(), describe(),
/// the agreement that Context() runs and docs/SETTINGS.md (ubep-info --settings-table) all come from it.
struct Setting {
  const char* name;     ///< the environment variable
  const char* type;     ///< what it takes, as the docs show it: "size", "seconds", "auto|am|rdma", ...
  bool collective;      ///< every rank must agree; Context() checks it
  bool testing;         ///< for testing, not for production runs
  const char* meaning;  ///< one paragraph for the docs
  /// The field's value in the form the variable takes ("256M", "auto", "self,shm,mpi").
  std::string (*value)(const Options&);
  /// Sets the field from `text` (internal: call parse()).
  void (*set)(Options&, const std::string& text, const char* name);
  /// Sets the field from the variable's text; throws Errc::invalid_argument naming the variable and the text.
  void parse(Options& o, const std::string& text) const { set(o, text, name); }
  /// Sets the field from the environment when the variable is set (and not empty); returns whether it was.
  bool read_env(Options& o) const;
};
/// The settings table, in the order of describe() and the docs.
std::span<const Setting> settings() noexcept;
/// The row of variable `name`; throws Errc::invalid_argument when no setting has that name.
const Setting& setting(std::string_view name);

/// Parses a byte size with an optional K/M/G/T suffix (powers of 2). Throws Errc::invalid_argument.
std::size_t parse_size(const std::string& text, const char* what);

}  // namespace ubep
