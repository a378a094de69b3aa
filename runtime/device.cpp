// The symmetric GPU heap (Context::alloc_device; docs/GPU.md "GPUs"): created collectively by the first call on the
// CUDA device current on each rank (or in host memory under UBEP_GPU_EMULATE=1), mapped by the node peers
// (transports/device_heap.hpp), and reached by put/get/put_signal as copies on one internal stream. Every rank
// fails together when one cannot take part: each step ends with an agreement on whether every rank succeeded,
// before the next one starts.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/mpi_check.hpp"
#include "base/poll.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/staged_route.hpp"
#include "runtime/state.hpp"
#include "transports/mpi_rma.hpp"
#include "transports/staging.hpp"
#include "transports/transport.hpp"
#include "ubep/config.hpp"
#include "ubep/gpu.hpp"

// MPIX_Query_cuda_support(): Open MPI declares it in mpi-ext.h, MPICH (4.0 on) in mpi.h; SimGrid has none.
#if !UBEP_SIMGRID && defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#define UBEP_MPI_HAS_CUDA_QUERY 1
#elif !UBEP_SIMGRID && defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40000000
#define UBEP_MPI_HAS_CUDA_QUERY 1
#else
#define UBEP_MPI_HAS_CUDA_QUERY 0
#endif

namespace ubep {
namespace detail {

namespace {

using staging::GetRequest;

/// Objects in the GPU heap are aligned to at least this (cudaMalloc's alignment; vector loads in kernels).
constexpr std::size_t kDeviceAlign = 256;

/// One step of the creation, agreed: every rank says whether its step succeeded (MINLOC over comm, polled with
/// the wait deadline); when one failed, each rank throws: the failed one its own error, the others
/// Errc::unsupported naming the first rank that failed and `what` it could not do.
void agree_step(State& s, const char* call, const std::exception_ptr& mine, const char* what) {
  struct Vote {
    int ok;
    int rank;
  };
  auto buf = std::make_unique<Vote[]>(2);  // MPI may still write into it after a timeout: kept then
  buf[0] = {mine ? 0 : 1, s.comms.rank};
  MPI_Request req = MPI_REQUEST_NULL;
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Iallreduce(&buf[0], &buf[1], 1, MPI_2INT, MPI_MINLOC, s.comms.comm, &req));
  try {
    s.wait_request(call, req, "the agreement on the GPU heap");
  } catch (...) {
    (void)buf.release();
    throw;
  }
  if (buf[1].ok) return;
  if (mine) std::rethrow_exception(mine);
  s.fail(Errc::unsupported, call,
         "no GPU heap: rank " + std::to_string(buf[1].rank) + " could not " + what +
             " (its error says why); every rank fails here, the context stays usable for host memory");
}

template <class Fn>
std::exception_ptr attempt(Fn&& fn) {
  try {
    fn();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

/// This rank's heap (step 1: a device and its IPC kind agreed by the node; step 2: the allocation).
std::unique_ptr<DeviceHeap> make_heap(State& s, const char* call) {
  const std::string where = s.prefix(call);
  std::unique_ptr<DeviceHeap> heap;
  if (s.options.gpu_emulate) {
    agree_step(s, call, attempt([&] { heap = make_emulated_device_heap(s.options.gpu_heap_size, where); }),
               "allocate its emulated GPU heap");
    return heap;
  }
#if UBEP_HAVE_CUDA
  const GpuStatus& g = gpu_status();
  cuda::DeviceChoice choice;
  agree_step(s, call, attempt([&] {
               if (!g.available) s.fail(Errc::unsupported, call, "no usable GPU here: " + g.reason);
               choice = cuda::choose_device(where);
             }),
             "find a usable GPU");
  // The node shares heaps one way: fd where every rank's device supports it, else legacy IPC.
  int ipc = static_cast<int>(choice.ipc), node_ipc = 0;
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allreduce(&ipc, &node_ipc, 1, MPI_INT, MPI_MIN, s.comms.node_comm));
  agree_step(s, call, attempt([&] {
               heap = cuda::make_device_heap(s.options.gpu_heap_size, choice.device, static_cast<cuda::Ipc>(node_ipc),
                                             where);
             }),
             "allocate its GPU heap");
  return heap;
#else
  s.fail(Errc::unsupported, call,
         "this libubep was built without CUDA: there is no GPU heap (UBEP_GPU_EMULATE=1 emulates one in host memory, "
         "for testing)");
#endif
}

/// What this rank's MPI says of GPU memory: 1 CUDA-aware (MPIX_Query_cuda_support() = 1), 0 not, -1 it cannot
/// say (no such query: SimGrid, other MPIs).
int cuda_aware_mpi() {
#if UBEP_MPI_HAS_CUDA_QUERY
  return MPIX_Query_cuda_support() ? 1 : 0;
#else
  return -1;
#endif
}

/// Collective (the job spans nodes): whether an MPI window over the GPU heap carries GPU-heap data to other
/// nodes (UBEP_GPU_MPI_WINDOW), and why; throws on every rank when "1" is refused.
bool use_window(State& s, const char* call, std::string& why) {
  const GpuMpiWindow mode = s.options.gpu_mpi_window;
  if (mode == GpuMpiWindow::off) return false;
  const int aware = cuda_aware_mpi();
  if (mode == GpuMpiWindow::on) {
    agree_step(s, call, attempt([&] {
                 if (!s.options.gpu_emulate && aware == 0) {
                   s.fail(Errc::unsupported, call,
                          "UBEP_GPU_MPI_WINDOW=1, but this MPI is not CUDA-aware (MPIX_Query_cuda_support() = 0): "
                          "it cannot move GPU memory; UBEP_GPU_MPI_WINDOW=auto takes the staged route");
                 }
               }),
               "use an MPI window over its GPU heap");
    why = "UBEP_GPU_MPI_WINDOW=1";
    return true;
  }
  int mine = aware == 1 ? 1 : 0, all = 0;
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, s.comms.comm));
  why = "CUDA-aware MPI: MPIX_Query_cuda_support() = 1 on every rank";
  return all == 1;
}

/// Collective: the window over the GPU heap and the mpi transport on it (flushes to other nodes bounded as the
/// mpi route's, UBEP_MPI_BOUNDED).
void open_window(State& s, const char* call) {
  DeviceMemory& d = *s.gpu.memory;
  UBEP_MPI_CHECK(
      s.comms.rank, call,
      MPI_Win_create(s.gpu.base, static_cast<MPI_Aint>(s.gpu.size), 1, MPI_INFO_NULL, s.comms.comm, &d.window));
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_set_errhandler(d.window, MPI_ERRORS_RETURN));
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_lock_all(MPI_MODE_NOCHECK, d.window));
  std::vector<std::uint8_t> off_node(s.comms.size, 1);
  for (const int r : s.comms.node_ranks) off_node[r] = 0;
  d.window_route = std::make_unique<MpiRmaTransport>(
      d.window, s.comms.rank, s.comms.size, false,
      !UBEP_SIMGRID && s.comms.thread_level == MPI_THREAD_MULTIPLE && s.options.mpi_bounded != MpiBounded::off,
      s.options.mpi_bounded == MpiBounded::all, std::move(off_node), s.options.wait_timeout, s.options.poll);
}

/// Collective: this rank's heap, the node peers' mapped; s.gpu.memory and s.gpu.base/size set on success.
void create(State& s, const char* call) {
  auto mem = std::make_unique<DeviceMemory>();
  mem->heap = make_heap(s, call);
  // Every heap must have one size (the granularity may differ between device models).
  unsigned long long size = mem->heap->size(), lo = 0, hi = 0;
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allreduce(&size, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, s.comms.comm));
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allreduce(&size, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, s.comms.comm));
  if (lo != hi) {
    s.fail(Errc::unsupported, call,
           "the GPU heaps differ in size across ranks (" + std::to_string(lo) + " to " + std::to_string(hi) +
               " bytes after rounding UBEP_GPU_HEAP_SIZE=" + std::to_string(s.options.gpu_heap_size) +
               " to each device's allocation granularity); set UBEP_GPU_HEAP_SIZE=" + std::to_string(hi));
  }
  const std::string where = s.prefix(call);
  agree_step(s, call, attempt([&] {
               mem->heap->map_node(
                   s.comms.node_comm, s.comms.rank, call, s.options.wait_timeout,
                   [&](MPI_Request& r) { s.wait_request(call, r, "the exchange of CUDA IPC handles"); }, where);
             }),
             "map the GPU heaps of its node peers");
  mem->alloc = HeapAllocator(0, mem->heap->size());
  mem->peer.assign(s.comms.size, nullptr);
  for (std::size_t r = 0; r < s.comms.node_ranks.size(); ++r)
    mem->peer[s.comms.node_ranks[r]] = mem->heap->peer(static_cast<int>(r));
  s.gpu.base = mem->heap->base();
  s.gpu.size = mem->heap->size();
  s.gpu.memory = std::move(mem);
  if (s.comms.node_ranks.size() == static_cast<std::size_t>(s.comms.size)) return;
  // The job spans nodes: an MPI window over the GPU heap, or the staged route, or no GPU heap at all (a later
  // alloc_device tries again).
  constexpr std::size_t kNone = ~std::size_t{0};
  std::size_t region = kNone;
  try {
    std::string why;
    if (use_window(s, call, why)) {
      s.gpu.memory->window_why = why;
      open_window(s, call);
      s.gpu.window = s.gpu.memory->window_route.get();
      return;
    }
    const std::size_t chunk = (s.options.gpu_staging_chunk + 63) / 64 * 64;
    const std::size_t bytes = StagedRoute::region_bytes(s.comms.size, chunk);
    const char* what = "alloc_device (the staged route's host buffers, UBEP_GPU_STAGING_CHUNK)";
    const std::optional<std::size_t> off = alloc_agreed(s, what, CollKind::alloc, s.heap.alloc, bytes, 64);
    // As in Context::alloc: signal messages the peers sent before the agreement (UBEP_MPI_SIGNAL=message) are
    // applied now, so none lands later in a word of a freed object whose block the counters below reuse.
    s.apply_sent_signal_messages(what);
    if (!off) throw_out_of_heap(s, what, s.heap.alloc, s.heap.size, "UBEP_HEAP_SIZE", bytes, 64);
    region = *off;
    std::memset(s.heap.base + region, 0, bytes);
    // No rank may send a chunk before every rank has zeroed its counters.
    s.collective(what, CollKind::signals, {static_cast<std::int64_t>(bytes)}, {"bytes"});
    s.gpu.memory->staged = std::make_unique<StagedRoute>(s, region, chunk);
    s.gpu.staged = s.gpu.memory->staged.get();
    // The progress thread (UBEP_PROGRESS_THREAD=1, or the ucx route's own) drives the route too where it is
    // thread-safe; the same answer on every rank: routes are symmetric.
    if (s.progress_thread.thread.joinable() && s.gpu.staged->ucx_only()) {
      s.gpu.staged->threaded = true;
      s.gpu.thread_staged.store(s.gpu.staged, std::memory_order_release);
    }
  } catch (...) {
    if (region != kNone) s.release(region);
    s.gpu.window = nullptr;
    s.gpu.memory.reset();
    s.gpu.base = nullptr;
    s.gpu.size = 0;
    throw;
  }
}

}  // namespace

DeviceMemory::DeviceMemory() = default;
DeviceMemory::~DeviceMemory() = default;

void DeviceMemory::close_window() noexcept {
  window_route.reset();
  if (window != MPI_WIN_NULL) {
    MPI_Win_unlock_all(window);
    MPI_Win_free(&window);
  }
}

void State::thread_progress_staged() noexcept {
  if (StagedRoute* r = gpu.thread_staged.load(std::memory_order_acquire)) r->thread_progress();
}

void State::progress_staged() {
  if (gpu.staged->progress()) flush_pending_signals();  // credits on the mpi route go out now, not at the next call
}

namespace {

/// Drives the staged route (and serves this rank's peers meanwhile) until done(), at most UBEP_WAIT_TIMEOUT: the
/// peers must progress too (they do in every ubep call).
template <class Done>
void drive_staged(State& s, const char* call, Done done) {
  const auto start = std::chrono::steady_clock::now();
  const double timeout = s.options.wait_timeout.count();
  Backoff backoff(s.options.poll);
  std::uint64_t turns = 0;  // every 16th turn checks the deadline, however busy the route keeps it
  while (!done()) {
    if (timeout > 0 && (++turns & 15) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout) {
      s.fail(Errc::timeout, call,
             "waited " + std::to_string(timeout) +
                 " s (UBEP_WAIT_TIMEOUT) for the staged GPU transfers to other nodes; a peer drains and serves them "
                 "only when it calls into ubep (or from its progress thread). Still pending:" +
                 s.gpu.staged->pending());
    }
    if (s.gpu.staged->progress()) {
      s.flush_pending_signals();
      continue;
    }
    if (s.routes.ucx) s.routes.ucx->poll();
    if (backoff.pause()) {
      if (s.routes.mpi) {
        s.routes.mpi->progress(s.comms.comm);
      } else {  // MPI's progress all the same: a target may be inside an MPI call of another context that
                // completes only with this process's MPI progress (osc ucx accumulates), before it drains ours
        int flag = 0;
        UBEP_MPI_CHECK(s.comms.rank, call,
                       MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, s.comms.comm, &flag, MPI_STATUS_IGNORE));
      }
    }
  }
}

}  // namespace

void State::synchronize_device(const char* call) {
  gpu.memory->heap->synchronize(prefix(call));
  if (gpu.memory->window_route && gpu.memory->window_route->outstanding()) gpu.memory->window_route->flush_all();
  if (gpu.staged && !gpu.staged->idle()) drive_staged(*this, call, [this] { return gpu.staged->idle(); });
  gpu.pending = false;
}

namespace {

/// The offset of [addr, addr + bytes) in the GPU heap and pe's heap as mapped here (null: another node, reached
/// by the window or the staged route); throws naming the call.
std::pair<std::size_t, char*> device_target(State& s, const char* call, const void* addr, std::size_t bytes, int pe) {
  const std::size_t off = check_heap_range(s, call, addr, bytes, s.gpu.base, s.gpu.size, s.gpu.memory->alloc,
                                           "symmetric GPU heap", "pass a pointer into an object from alloc_device");
  return {off, s.gpu.memory->peer[pe]};
}

}  // namespace

void State::device_put(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete) {
  const auto [off, peer] = device_target(*this, call, dest, bytes, pe);
  if (peer != nullptr) {
    gpu.memory->heap->copy_async(peer + off, src, bytes, prefix(call));
  } else if (gpu.memory->window_route) {  // complete at synchronize_device's flush (below, or at quiet())
    gpu.memory->window_route->put_nbi(off, src, bytes, pe);
  } else {
    gpu.staged->put(pe, src, off, bytes);
    progress_staged();  // the first chunks start now
  }
  gpu.pending = true;
  if (complete) synchronize_device(call);
}

void State::device_get(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete) {
  const auto [off, peer] = device_target(*this, call, src, bytes, pe);
  if (peer != nullptr) {
    gpu.memory->heap->copy_async(dest, peer + off, bytes, prefix(call));
  } else if (!gpu.memory->window_route) {  // the staged route: pe sends the data when it calls into ubep
    if (gpu.staged->ring_full(pe)) drive_staged(*this, call, [&] { return !gpu.staged->ring_full(pe); });
    const std::uint64_t seq =
        gpu.staged->request_get(GetRequest{off, bytes, reinterpret_cast<std::uintptr_t>(dest), 0}, pe);
    progress_staged();
    gpu.pending = true;
    // get waits for its own data only, not for this rank's other staged transfers (quiet() does that)
    if (complete) drive_staged(*this, call, [&] { return gpu.staged->landed(pe, seq); });
    return;
  } else if (complete) {
    gpu.memory->window_route->get(dest, off, bytes, pe);  // dest holds the data on return
  } else {
    gpu.memory->window_route->get_nbi(dest, off, bytes, pe);
  }
  gpu.pending = true;
  if (complete) synchronize_device(call);
}

void* State::device_ptr(const char* call, const void* dest, std::size_t bytes, int pe) {
  const std::size_t off = check_heap_range(*this, call, dest, bytes, gpu.base, gpu.size, gpu.memory->alloc,
                                           "symmetric GPU heap", "pass a pointer into an object from alloc_device");
  char* peer = gpu.memory->peer[pe];
  return peer ? peer + off : nullptr;
}

bool State::release_device(std::size_t offset) noexcept { return gpu.memory && gpu.memory->alloc.release(offset); }

}  // namespace detail

using detail::State;

void* Context::alloc_device_bytes(std::size_t count, std::size_t elem_size, std::size_t align) {
  State& s = *state_;
  const char* call = "alloc_device";
  const std::size_t bytes = detail::alloc_request(s, call, count, elem_size, align, detail::kDeviceAlign);
  s.quiet();  // device copies too: nothing aimed at a freed object lands in the new one
  if (!s.gpu.memory) detail::create(s, call);
  const std::optional<std::size_t> off =
      detail::alloc_agreed(s, call, detail::CollKind::alloc_device, s.gpu.memory->alloc, bytes, align);
  if (bytes == 0) return nullptr;
  if (!off) detail::throw_out_of_heap(s, call, s.gpu.memory->alloc, s.gpu.size, "UBEP_GPU_HEAP_SIZE", bytes, align);
  return s.gpu.base + *off;
}

void Context::copy(void* dst, const void* src, std::size_t bytes) {
  State& s = *state_;
  const char* call = "copy";
  s.check_alive(call);
  if (bytes == 0) return;
  if (dst == nullptr || src == nullptr) {
    s.fail(Errc::invalid_argument, call,
           std::string(dst == nullptr ? "dst" : "src") + " is null for " + std::to_string(bytes) + " bytes");
  }
  if (!s.gpu.memory) {
    std::memcpy(dst, src, bytes);
    return;
  }
  s.gpu.memory->heap->copy_async(dst, src, bytes, s.prefix(call));
  s.gpu.memory->heap->synchronize(s.prefix(call));
}

namespace detail {

std::string gpu_heap_description(const State& s) {
  if (!s.gpu.memory) {
    return "not created (the first alloc_device creates UBEP_GPU_HEAP_SIZE=" + std::to_string(s.options.gpu_heap_size) +
           (s.options.gpu_emulate ? " bytes of host memory EMULATING a GPU: UBEP_GPU_EMULATE=1, testing)"
                                  : " bytes on the current CUDA device)");
  }
  return s.gpu.memory->heap->describe();
}

std::string gpu_path(const State& s, int pe) {
  if (pe == s.comms.rank) return "self: copies within this rank's GPU heap";
  if (std::find(s.comms.node_ranks.begin(), s.comms.node_ranks.end(), pe) != s.comms.node_ranks.end())
    return "CUDA IPC: the node peer's GPU heap mapped here, copies on ubep's stream";
  if (s.gpu.memory && s.gpu.memory->window_route) {
    return "MPI window: another node, MPI_Put/MPI_Get on a window over the GPU heap (" + s.gpu.memory->window_why + ")";
  }
  if (!s.gpu.memory && s.options.gpu_mpi_window != GpuMpiWindow::off) {  // decided by the first alloc_device
    const std::string window = s.options.gpu_mpi_window == GpuMpiWindow::on ? "UBEP_GPU_MPI_WINDOW=1"
                               : cuda_aware_mpi() == 1                      ? "if every rank's MPI is CUDA-aware"
                                                                            : "";
    if (!window.empty()) {
      return "MPI window: another node, MPI_Put/MPI_Get on a window over the GPU heap (" + window +
             ", decided at the first alloc_device)";
    }
  }
  return std::string("staged: another node, device -> host -> route ") + to_string(s.routes.route[pe]) +
         " -> host -> device in chunks of UBEP_GPU_STAGING_CHUNK=" + std::to_string(s.options.gpu_staging_chunk) +
         " (a get asks the peer to send)" +
         (s.gpu.staged && s.gpu.staged->threaded ? "; the progress thread drives it" : "");
}

}  // namespace detail
}  // namespace ubep
