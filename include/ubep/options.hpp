/// \file options.hpp
/// Every setting of ubep in one struct, read once from the environment (UBEP_*). A program may also build
/// an Options by hand and pass it to the Context. All ranks must use the same values for the settings
/// marked "collective"; the Context checks the heap size and the transports and throws otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
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
};

/// The settings of a Context. Defaults are the documented defaults of the environment variables.
struct Options {
  /// UBEP_HEAP_SIZE (collective): bytes of symmetric heap per rank. Suffixes K, M, G (powers of 2). Default 256M.
  std::size_t heap_size = std::size_t{256} << 20;
  /// UBEP_WAIT_TIMEOUT: seconds every wait may block before it throws Errc::timeout. Default 300; 0 = never.
  std::chrono::duration<double> wait_timeout{300.0};
  /// UBEP_POLL: the polling policy of every wait; see PollPolicy::parse.
  PollPolicy poll{};
  /// UBEP_TRANSPORTS (collective): the transports the route table may use among self, shm, ucx, mpi.
  /// Each peer gets the first of self (this rank), shm (same node), then ucx, then mpi that reaches it:
  /// ucx is preferred over mpi off the node whenever it is named. Default "self,shm,ucx,mpi" in builds
  /// with UCX (default_transports()), "self,shm,mpi" otherwise, "self,mpi" in SimGrid builds (shared memory
  /// is not simulated: a rank polling it would never yield to the simulation). "mpi" alone sends every operation, to
  /// self too, through MPI RMA; "ucx" alone, through UCX; "self,shm,mpi" forces MPI RMA off the node.
  std::vector<std::string> transports = default_transports();
  /// UBEP_UCX_MODE (collective): how the ucx route moves data to each peer. "auto" (default): rdma where
  /// the endpoint has one lane with hardware RMA and atomics (InfiniBand/RoCE rc, dc), am elsewhere
  /// (TCP, shared memory); "am": active messages to every peer; "rdma": put, fence and atomics to every
  /// peer (where UCX has no hardware lane for them it emulates them in software, which needs the
  /// target's progress and is slower than am: for testing). See docs/ROUTES.md, "The ucx route".
  std::string ucx_mode = "auto";
  /// UBEP_PROGRESS_THREAD (collective): "auto" (default), "1" or "0".
  /// 1 sets this: a thread that calls into MPI every UBEP_PROGRESS_INTERVAL_US while the application computes,
  /// so RMA aimed at this rank keeps completing; it also drives the UCX worker, and the staged GPU route where the
  /// ranks of other nodes are on the ucx route. Needs MPI_THREAD_MULTIPLE. Default false.
  bool progress_thread = false;
  /// Set by UBEP_PROGRESS_THREAD=auto (the default) and 1, cleared by 0. Where UCX is in use (some peer on the ucx
  /// route) and progress_thread is false, a thread that sleeps on the UCX worker's event file descriptor
  /// (ucp_worker_arm) and wakes only when a message arrives for this rank: it runs the handlers (data, signals,
  /// atomics), answers gets, fetching atomics and flushes, and drives the staged GPU route, so a peer's quiet(),
  /// get or atomic completes while this rank computes or sits in a plain MPI call. It calls no MPI (any thread
  /// level); an idle job wakes it about once a second. docs/ROUTES.md, "The ucx route".
  bool ucx_progress_thread = true;
  /// UBEP_GPU: 1 initializes CUDA when a Context is created (ubep::gpu_status()), and every rank's
  /// Context() fails (Errc::unsupported, naming the rank and CUDA's answer) when one rank has no usable GPU.
  /// 0 (default): libubep leaves CUDA untouched until something asks for a GPU. Must match on every rank.
  bool gpu = false;
  /// UBEP_GPU_HEAP_SIZE (collective): bytes of symmetric GPU heap per rank, on the CUDA device current at the
  /// first Context::alloc_device (which creates it; nothing is allocated on a GPU before). Suffixes K, M, G.
  /// Rounded up to the device's allocation granularity (2 MiB on current GPUs). Default 1G.
  std::size_t gpu_heap_size = std::size_t{1} << 30;
  /// UBEP_GPU_STAGING_CHUNK (collective): bytes per chunk of the staged route that carries GPU-heap data to
  /// and from peers on other nodes (device -> host -> the host route -> host -> device, 2 chunks in flight per
  /// pair of ranks). Its buffers come out of the host heap: 4 chunks per rank of the job, on every rank, when the job
  /// spans more than one node (256 KiB per rank at the default). Suffixes K, M, G. Default 64K.
  std::size_t gpu_staging_chunk = std::size_t{64} << 10;
  /// UBEP_GPU_EMULATE (collective, testing): 1 makes the GPU heap shared host memory standing in for device
  /// memory (copies are memcpy, node peers map it through the same fd exchange as CUDA's fd handles), on any
  /// machine, GPU or not, so that alloc_device and every call on GPU addresses run where there is no GPU.
  /// Everything that describes the heap says EMULATING. Default 0.
  bool gpu_emulate = false;
  /// UBEP_GPU_MPI_WINDOW (collective): how GPU-heap data reaches ranks of other nodes. "auto" (default): an MPI
  /// window over the GPU heap (MPI_Put/MPI_Get with device addresses) when every rank's MPI says it is
  /// CUDA-aware (MPIX_Query_cuda_support() = 1), else the staged route (UBEP_GPU_STAGING_CHUNK). "1": the
  /// window always (for an MPI that is CUDA-aware without that query, or for testing with UBEP_GPU_EMULATE=1;
  /// refused with a real GPU heap when MPIX_Query_cuda_support() says 0). "0": the staged route always.
  std::string gpu_mpi_window = "auto";
  /// UBEP_PROGRESS_INTERVAL_US: how often the progress thread calls into MPI. Default 50.
  std::uint32_t progress_interval_us = 50;
  /// UBEP_VIRTUAL_NODES (collective, testing): split the ranks of each real node into emulated nodes.
  /// "N" = N nodes of consecutive ranks; "0,1|2,3" = explicit rank lists per node. Empty = off.
  /// Ranks on different emulated nodes use the off-node route (ucx in builds with UCX, else mpi) and see
  /// "node" or farther distances; every output that depends on it says that it is emulated.
  std::string virtual_nodes;
  /// UBEP_SCHEDULE: order of peers in all-to-all traffic: linear, shifted or topology (default).
  std::string schedule = "topology";
  /// UBEP_TOPOLOGY_FILE: a Slurm topology.conf giving switch-level distances between nodes. Empty = none.
  std::string topology_file;
  /// UBEP_TOPOLOGY_PROBE: 1 refines the cost matrix with a measured ping-pong per distance class. Default 0.
  bool topology_probe = false;
  /// UBEP_RUN_AHEAD: how many MoE calls a rank may run ahead of the slowest peer (buffer sets). Default 2.
  std::uint32_t run_ahead = 2;
  /// UBEP_MPI_SIGNAL: how a SignalOp::set signal travels on the mpi route. "put" (default): an 8-byte
  /// MPI_Put issued after the flush that completes the data; "accumulate": MPI_Accumulate(MPI_REPLACE).
  /// SignalOp::add is always MPI_Accumulate(MPI_SUM). Open MPI 4.1's osc ucx runs every accumulate under
  /// a remote lock (two to three round trips); see docs/ROUTES.md, "Signals as messages". "message": every
  /// signal (set and add) is an MPI_Send of {offset, op, value} on a communicator of its own after the
  /// flush that completes the data, applied by the target when it next calls into ubep (a wait, test*,
  /// progress(), barrier()); a waiting rank receives instead of polling memory. The default in SimGrid
  /// builds (UBEP_SIMGRID), where a wait then blocks in MPI_Wait.
  bool mpi_signal_put = !UBEP_SIMGRID;
  /// UBEP_MPI_SIGNAL=message (see above).
  bool mpi_signal_message = UBEP_SIMGRID != 0;
  /// UBEP_MPI_BOUNDED: which blocking MPI calls of the mpi route get the wait deadline (they then run on
  /// a worker thread while the caller polls; see context.hpp "Deadlines"). "auto" (default): every call
  /// to a peer on the mpi route (on this host too: osc ucx completes puts into its window only with its
  /// progress), and fetching atomics to any peer (osc ucx emulates them at the target); accumulates and
  /// flushes to mapped (shm) peers run inline, since MPI completes them through shared memory without the
  /// target. "all": every call (for UCX_TLS without shared memory on one
  /// host). "off": none (every call inline, unbounded).
  std::string mpi_bounded = "auto";

  /// The transports of a default Options: "self,shm,ucx,mpi" in builds with UCX, "self,mpi" in SimGrid
  /// builds, else "self,shm,mpi".
  static std::vector<std::string> default_transports();
  /// Reads every UBEP_* variable once. Throws Errc::invalid_argument naming the variable and the value
  /// when one cannot be parsed.
  static Options from_env();
  /// The settings as "NAME=value" lines, for ubep-info and benchmark headers.
  std::vector<std::string> describe() const;
};

/// Parses a byte size with an optional K/M/G/T suffix (powers of 2). Throws Errc::invalid_argument.
std::size_t parse_size(const std::string& text, const char* what);

}  // namespace ubep
