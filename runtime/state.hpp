// The whole state of one Context (private to the runtime layer). Context and Symmetric reach it through
// their shared_ptr<detail::State>; no other layer includes this file, and nothing here is installed.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/heap.hpp"
#include "transports/load_store.hpp"
#include "transports/mpi_rma.hpp"
#include "ubep/context.hpp"
#include "ubep/topology.hpp"

namespace ubep::detail {

struct GpuStreams;    // runtime/gpu_streams.hpp
struct DeviceMemory;  // runtime/device_memory.hpp: the symmetric GPU heap
struct StagedRoute;   // runtime/staged_route.hpp: its staged route to other nodes

/// Kinds of collective call; every ubep collective first agrees on (kind, sequence, arguments) so that
/// mismatched calls are reported instead of corrupting memory or hanging.
/// The heap base is aligned to this on every rank, so an offset aligned to A <= kHeapAlign gives a
/// pointer aligned to A (Context::alloc promises max(64, alignof(T))).
inline constexpr std::size_t kHeapAlign = 4096;

/// The MPI op an atomic uses on the mpi route; `any` (fetch, MPI_NO_OP) is atomic with all of them.
enum class AtomicFamily : std::uint8_t { any, sum, replace, cas };

enum class CollKind : std::int64_t {
  create = 1,
  alloc,
  free,
  signals,
  barrier,
  finalize,
  moe_setup,
  user,
  alloc_device
};
const char* to_string(CollKind kind) noexcept;

/// The communicators of a Context and this rank's place in them.
struct Comms {
  MPI_Comm comm = MPI_COMM_NULL;       // dup of the user's communicator, MPI_ERRORS_RETURN
  MPI_Comm node_comm = MPI_COMM_NULL;  // ranks on this (real or emulated) node
  MPI_Comm progress_comm = MPI_COMM_NULL;
  MPI_Comm signal_comm = MPI_COMM_NULL;  // UBEP_MPI_SIGNAL=message: the signal messages of the mpi route
  int rank = 0, size = 1;
  int node_id = 0;
  std::vector<int> node_ranks;  // world ranks on this node, in node order
  bool owns_mpi = false;
  int thread_level = MPI_THREAD_SINGLE;
};

/// The symmetric host heap: its windows, where it starts here, and the objects in it.
struct HostHeap {
  MPI_Win node_win = MPI_WIN_NULL;
  MPI_Win world_win = MPI_WIN_NULL;
  char* base = nullptr;
  std::size_t size = 0;
  HeapAllocator alloc;
};

/// The route table: per peer, its route and the transports of its data, atomics and signals.
struct RouteTable {
  std::vector<Route> route;
  std::vector<Transport*> transport_of;  // per peer, for data
  std::unique_ptr<LoadStoreTransport> load_store;
  std::unique_ptr<MpiRmaTransport> mpi;
  std::unique_ptr<Transport> ucx;      // transports/ucx/ (UCX builds, UBEP_TRANSPORTS with ucx)
  Transport* atomics = nullptr;        // the atomics path beyond load/store: mpi, ucx, or load/store when none
  std::vector<Transport*> atomics_to;  // per peer: the transport of atomics and signals (see Context())
  bool uses_mpi = false;               // some operation goes through MPI: waits must progress it
  /// Per peer: its mapped heap when its route is self or shm (a put is a memcpy there), else null.
  std::vector<char*> mapped;
  /// Per peer: its mapped heap when its signals and atomics are load/store too, else null: put_signal and
  /// signal_op to it are a copy and one release store or add (the fast path of signals.cpp).
  std::vector<char*> mapped_signals;
};

// ---- deferred signals of put_signal_nbi / signal_op on the mpi route ----
struct PendingSignal {
  std::size_t offset;
  std::uint64_t value;
  SignalOp op;
  int pe;
};

/// What this rank has in flight on the mpi route that a later call must respect.
struct InFlight {
  std::vector<PendingSignal> signals;  // deferred signals, issued by State::issue_pending_signals
  /// Atomics through MPI: the kind of this rank's non-fetching atomics (add, set) in flight on each target word,
  /// key offset * size + pe; forgotten when quiet() or flush(pe) completes them.
  std::map<std::uint64_t, AtomicFamily> atomic_family;
};

/// The progress thread beside the caller's (runtime/progress.cpp), if any.
struct ProgressWorker {
  std::thread thread;
  std::atomic<bool> stop{false};
  int wake_fd = -1;           // the ucx thread's stop signal (an eventfd it polls beside UCX's)
  std::string kind = "none";  // what the progress thread does, for info()
};

/// The symmetric GPU heap (runtime/device.cpp): created by the first Context::alloc_device.
struct GpuHeap {
  /// The stream-ordered calls' registrations and wait slots (runtime/stream.cpp); null until the first one.
  std::unique_ptr<GpuStreams> streams;
  char* base = nullptr;  // this rank's GPU heap; null (and size 0) until created
  std::size_t size = 0;
  bool pending = false;  // device copies issued and not yet complete (put_nbi, get_nbi)
  std::unique_ptr<DeviceMemory> memory;
  StagedRoute* staged = nullptr;      // memory->staged: the staged route of GPU-heap data to other nodes, or null
  MpiRmaTransport* window = nullptr;  // memory->window_route (UBEP_GPU_MPI_WINDOW), or null
  /// The staged route when the progress thread drives it too (UBEP_PROGRESS_THREAD=1 and every rank of other
  /// nodes on the ucx route, whose transport is then thread-safe), else null; set once, at its creation.
  std::atomic<StagedRoute*> thread_staged{nullptr};
};

class State {
 public:
  Comms comms;
  Options options;
  HostHeap heap;
  RouteTable routes;
  InFlight in_flight;
  Topology topology;
  std::uint64_t collective_seq = 0;
  bool finalized = false;
  bool broken = false;  // a collective timed out: the communicator can no longer be trusted
  ProgressWorker progress_thread;
  GpuHeap gpu;

  Transport& atomics_of(int pe) const { return *routes.atomics_to[pe]; }
  /// A fetching atomic on pe's atomics path. With UCX in use, one on the load/store path (self, shm)
  /// also progresses the worker: a rank that spins on a local word (a lock) lets remote messages land.
  std::uint64_t fetch_atomic(AtomicOp op, std::size_t offset, std::uint64_t operand, std::uint64_t compare, int pe) {
    Transport& at = atomics_of(pe);
    const std::uint64_t old = at.fetch_atomic(op, offset, operand, compare, pe);
    if (routes.ucx && &at != routes.ucx.get()) routes.ucx->poll();
    return old;
  }

  // ---- the GPU heap (runtime/device.cpp) ----
  /// Moves the staged route on (arrivals, copies, credits): in every wait, progress() and collective.
  void progress_staged();
  /// The progress thread's step of the staged route (device.cpp): skipped while the caller's thread is in it;
  /// an error is kept for the caller's thread, which throws it at its next step.
  void thread_progress_staged() noexcept;
  /// True for an address in this rank's GPU heap (one subtraction and compare; false before it exists).
  bool device_holds(const void* p) const noexcept {
    return reinterpret_cast<std::uintptr_t>(p) - reinterpret_cast<std::uintptr_t>(gpu.base) < gpu.size;
  }
  /// Completes this rank's device copies: in quiet(), flush(), fence() and before every signal, so a signal
  /// never overtakes device data issued before it.
  void complete_device(const char* call) {
    if (gpu.pending) synchronize_device(call);
  }
  void synchronize_device(const char* call);
  /// Device memory on pe (put/get with a symmetric address in the GPU heap); `complete`: wait for the copy.
  void device_put(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete);
  void device_get(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete);
  /// ptr() of a GPU-heap range: pe's heap as mapped here (node peers), null off the node.
  void* device_ptr(const char* call, const void* dest, std::size_t bytes, int pe);
  /// The GPU heap's half of release_symmetric and free_symmetric.
  bool release_device(std::size_t offset) noexcept;

  // ---- checks (each throws ubep::Error naming rank, call and value) ----
  std::string prefix(const char* call) const;
  [[noreturn]] void fail(Errc code, const char* call, const std::string& what) const;
  void check_alive(const char* call) const {
    if (finalized) fail(Errc::finalized, call, "the context was finalized");
  }
  void check_pe(const char* call, int pe) const {
    if (pe < 0 || pe >= comms.size) {
      fail(Errc::out_of_range, call,
           "target rank " + std::to_string(pe) + " is out of range [0, " + std::to_string(comms.size) + ")");
    }
  }
  /// Validates a symmetric range [addr, addr + bytes) and returns its heap offset: inside the heap and
  /// inside one live object. A few compares when the object is one of the last the heap looked up (see
  /// HeapAllocator::recent), else check_range_slow, which also says what is wrong.
  std::size_t check_range(const char* call, const void* addr, std::size_t bytes) const {
    const std::size_t off = reinterpret_cast<std::uintptr_t>(addr) - reinterpret_cast<std::uintptr_t>(heap.base);
    const HeapAllocator::Block* b = heap.alloc.recent(off);  // off wraps for addresses below the heap: no block
    if (b != nullptr && bytes <= b->offset + b->size - off) return off;
    return check_range_slow(call, addr, bytes);
  }
  std::size_t check_range_slow(const char* call, const void* addr, std::size_t bytes) const;
  std::size_t check_word(const char* call, const void* addr) const {
    if (reinterpret_cast<std::uintptr_t>(addr) % 8 != 0) fail_misaligned(call, addr);
    return check_range(call, addr, 8);
  }
  [[noreturn]] void fail_misaligned(const char* call, const void* addr) const;
  /// The argument checks of a wait on `sigs` (alive, range, alignment, WaitOptions::writers); signals.cpp.
  void check_wait(const char* call, std::span<const std::uint64_t> sigs, const WaitOptions& opts) const;
  /// The bodies of put_signal (`blocking`), put_signal_nbi and signal_op after their checks (signals.cpp): data
  /// at heap offset `off`, then the signal at `soff`, on pe's routes; also for ubep's own messages (the staged
  /// GPU route).
  void put_signal_checked(std::size_t off, const void* src, std::size_t bytes, std::size_t soff, std::uint64_t value,
                          SignalOp op, int pe, bool blocking);
  /// pe's heap mapped here when a put_signal to it is a copy and one release store or add with nothing before
  /// it: pe in range, its data and signals load/store, the context alive, no device copies pending, `dest`
  /// not in the GPU heap. Null otherwise (the caller takes the full path, which also reports what is wrong).
  char* mapped_signal_target(int pe, const void* dest, std::size_t bytes) const noexcept {
    if (static_cast<unsigned>(pe) >= static_cast<unsigned>(comms.size) || finalized || gpu.pending) return nullptr;
    if (bytes && device_holds(dest)) return nullptr;
    return routes.mapped_signals[static_cast<std::size_t>(pe)];
  }
  static constexpr AtomicOp atomic_of(SignalOp op) noexcept {
    return op == SignalOp::set ? AtomicOp::set : AtomicOp::add;
  }
  /// The data and the signal to a mapped_signal_target: complete on return.
  static void put_signal_mapped(char* m, std::size_t off, const void* src, std::size_t bytes, std::size_t soff,
                                std::uint64_t value, SignalOp op) noexcept {
    if (bytes) std::memcpy(m + off, src, bytes);
    apply_posted(m, soff, atomic_of(op), value);
  }
  /// signal_op's body after its checks. `after_every_put`: ordered after this rank's puts to every peer (signal_op's
  /// promise; with UCX that may flush the other ucx peers first); false for ubep's own signals that follow only
  /// local work or this rank's stream to pe (the staged route's credits), which then never wait for a peer.
  void signal_checked(std::size_t soff, std::uint64_t value, SignalOp op, int pe, bool after_every_put = true);
  /// Checks for an atomic on (addr, pe), delivers deferred signals first, returns the heap offset.
  /// `fetching`: complete on return (records no kind; see InFlight::atomic_family).
  std::size_t prepare_atomic(const char* call, const void* addr, int pe, AtomicFamily family, bool fetching);
  Transport& data_route(int pe) const { return *routes.transport_of[pe]; }

  // ---- progress and completion ----
  /// Issues the deferred signals (after one flush per peer with data in flight); free when there are none.
  void flush_pending_signals() {
    if (!in_flight.signals.empty()) issue_pending_signals();
  }
  void issue_pending_signals();
  void progress();
  void quiet();
  /// UBEP_MPI_SIGNAL=message, in barrier() and alloc: applies every signal message the peers sent before
  /// their call (one reduce-scatter of the counts sent, then receives until they are all applied, with the
  /// wait deadline). Else nothing.
  void apply_sent_signal_messages(const char* call);

  /// Agrees with every rank on (kind, seq, args); throws collective_mismatch (on every rank) when they
  /// differ, timeout when not every rank joins before the deadline.
  /// `names` label the arguments in the error message.
  void collective(const char* call, CollKind kind, std::initializer_list<std::int64_t> args,
                  std::initializer_list<const char*> names = {});
  void collective(const char* call, CollKind kind, std::span<const std::int64_t> args,
                  std::span<const std::string> names);
  /// Polls `req` to completion with the back-off and the wait timeout.
  void wait_request(const char* call, MPI_Request& req, const char* what);

  /// Local release of a heap block (no communication).
  bool release(std::size_t offset) noexcept;

  ~State();
  void stop_progress_thread() noexcept;  // joins the progress thread, if any; idempotent (runtime/progress.cpp)
  void teardown() noexcept;              // frees MPI objects (collective); used by finalize() and a failed Context()
};

/// The checks of a symmetric range in one heap (the host heap's check_range_slow, the GPU heap's): inside
/// [base, base + size) and inside one live object of `heap`, else State::fail naming the heap (`name`) and
/// `hint` (what to pass instead). Returns the offset.
std::size_t check_heap_range(const State& s, const char* call, const void* addr, std::size_t bytes, const char* base,
                             std::size_t size, const HeapAllocator& heap, const char* name, const char* hint);

/// The steps alloc and alloc_device share (context.cpp). alloc_request: checks the context, the size and the
/// alignment (raised to at least `min_align`); returns the bytes. alloc_agreed: allocates in `heap` and agrees
/// on (bytes, offset) with every rank (the block is released when that throws); nullopt when it did not fit
/// (or bytes is 0). throw_out_of_heap: the OutOfHeap error naming `env` and the size to set.
std::size_t alloc_request(const State& s, const char* call, std::size_t count, std::size_t elem_size,
                          std::size_t& align, std::size_t min_align);
std::optional<std::size_t> alloc_agreed(State& s, const char* call, CollKind kind, HeapAllocator& heap,
                                        std::size_t bytes, std::size_t align);
[[noreturn]] void throw_out_of_heap(const State& s, const char* call, const HeapAllocator& heap, std::size_t heap_size,
                                    const char* env, std::size_t bytes, std::size_t align);

/// The last phase of Context() (runtime/progress.cpp): the progress thread the options ask for, if any (the full
/// one for UBEP_PROGRESS_THREAD=1, the ucx route's own where UCX is in use and UBEP_PROGRESS_THREAD=auto).
void start_progress(State& s, const char* call);

/// For Context::info(): the GPU heap in one line, and how GPU-heap data reaches pe (runtime/device.cpp).
std::string gpu_heap_description(const State& s);
std::string gpu_path(const State& s, int pe);

}  // namespace ubep::detail
