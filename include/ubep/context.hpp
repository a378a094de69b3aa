/// \file context.hpp
/// ubep::Context: the global address space over one MPI communicator, and every data-movement call.
///
/// Addresses. Every rank holds a symmetric heap of Options::heap_size bytes. Collective allocations
/// (alloc, alloc_signals) return the same offset on every rank, so a local pointer into the heap names
/// the same object on every rank: `put(obj.data() + i, src, n, pe)` writes element i of obj on rank pe.
///
/// What completes when. The `@note` on each communication declaration (here, in symmetric.hpp and in
/// moe.hpp) is THE statement of its contract; docs/ and the internal headers point here. Every note
/// says, in this order, itself or through its completion class (below):
///  - Local completion: when the call is done with the caller's memory: a source may be reused, the
///    destination of a get or the result of an atomic holds the data.
///  - Remote completion: when the data or update is in the target's memory, where the target's waits and
///    other ranks' operations see it (the target's plain loads see it once it has synchronized with this
///    rank, e.g. by waiting for a signal that follows the data). quiet() gives both for every operation
///    issued before it, flush(pe) for those to pe; fence() only orders.
///  - Blocks: whether the call can wait, for what, and for how long.
///  - Communicates: no; with pe; with the peers named; or collective over the communicator (every rank
///    calls it, in the same order).
/// Completion classes. Most calls share one of these contracts; their note names the class and says only what
/// differs (the other calls spell out their own):
///  - collective (alloc, alloc_device, alloc_signals, barrier; Context(), finalize() and agree() as their notes
///    say): every rank of comm() calls it, in the same order, with the same arguments, else every rank throws
///    Errc::collective_mismatch. Local completion: on return, and every operation this rank issued before is
///    complete (quiet()). Remote completion: no rank returns before every rank has completed the operations it
///    issued before and joined. Blocks: quiet(), then the agreement, at most UBEP_WAIT_TIMEOUT each.
///    Communicates: collective over comm().
///  - blocking RMA (put, get): Local completion: on return (a put's `src` may be reused, a get's `dest` holds
///    the data). Remote completion: self/shm on return; mpi at the next quiet() or flush(pe). Blocks: self/shm
///    no; mpi an ordering flush if a fence() is pending, then MPI_Win_flush_local(pe), at most
///    UBEP_WAIT_TIMEOUT. Communicates: with pe. GPU heap: as "GPU heap" below.
///  - non-blocking RMA (put_nbi, get_nbi): Local and remote completion: self/shm on return; mpi at the next
///    quiet() or flush(pe) (only then may `src` be reused, or does `dest` hold the data). Blocks: self/shm no;
///    mpi only for an ordering flush (a pending fence()), at most UBEP_WAIT_TIMEOUT. Communicates: with pe.
///    GPU heap: as "GPU heap" below.
///  - fetching atomic (atomic_fetch_add, atomic_compare_swap, atomic_swap, atomic_fetch): Local completion: on
///    return (the result holds the old value). Remote completion: load/store atomics on return; through MPI at
///    the next quiet() or flush(pe). Blocks: load/store atomics no; through MPI deferred signals delivered
///    first, an ordering flush, then one round trip to pe (the MPI call + MPI_Win_flush_local), at most
///    UBEP_WAIT_TIMEOUT for any pe. Communicates: with pe.
///  - non-fetching atomic (atomic_add, atomic_set): Local completion: on return (nothing of the caller's is
///    read later). Remote completion: as a fetching atomic. Blocks: load/store atomics no; through MPI
///    deferred signals delivered first, an ordering flush (always when data to pe is in flight), then
///    MPI_Accumulate, at most UBEP_WAIT_TIMEOUT each. Communicates: with pe.
///  - wait (wait_until, wait_until_all, wait_until_any, wait_until_some): Local completion: on return the
///    condition held, and the data of the put_signal (or the puts before the signal_op) that made it hold is
///    visible here (on the mpi route after MPI_Win_sync). Remote completion: this rank's deferred signals are
///    delivered first, also when the condition already holds. Blocks: until the condition holds, at most
///    WaitOptions::timeout or UBEP_WAIT_TIMEOUT (0 = no deadline); delivering deferred signals at most
///    UBEP_WAIT_TIMEOUT per MPI call. Communicates: no messages but this rank's deferred signals; while it
///    waits it lets MPI progress (MPI_Win_sync + MPI_Iprobe).
///  - test (test, test_all, test_any, test_some, progress): Local completion: on return (the result is what
///    the words held when read). Remote completion: this rank's deferred signals are delivered first. Blocks:
///    never for a condition or for a peer's action; delivering deferred signals (mpi: one MPI_Win_flush per
///    peer with data in flight, then the signals) at most UBEP_WAIT_TIMEOUT per MPI call. Communicates: no
///    messages but this rank's deferred signals; when the mpi route is in use it lets MPI progress
///    (MPI_Win_sync + MPI_Iprobe).
///  - local (ptr, signal_fetch, copy): Local completion: on return. Remote completion: none. Blocks: no.
///    Communicates: no.
///  - stream-ordered (put_signal_on_stream, signal_op_on_stream, wait_until_on_stream): Local completion: on
///    return nothing has happened yet; the call runs when the stream reaches it. Remote completion: when the
///    stream reaches it. Blocks: no. Communicates: with pe, through its memory; no MPI.
/// The words the notes use:
///  - self/shm vs mpi: the route of pe (route(pe)). On self/shm a put or get is a memcpy into the mapped
///    heap, on mpi it is MPI RMA on the world window. Atomics and signals take one path for every peer:
///    "load/store atomics" (CPU atomics) when atomics_through_mpi() is false, "through MPI" otherwise,
///    for self and shm peers too. The ucx route (the default off the node in builds with UCX; docs/ROUTES.md
///    "The ucx route") behaves as the notes say for mpi, except:
///     - atomics and signals take the ucx path for every peer when some peer is on ucx: in am mode CPU
///       atomics applied by the target (atomic with load/store atomics, every kind with every other;
///       atomics_through_mpi() is false), in rdma mode UCX's atomics (atomic with each other);
///     - signals are never deferred, and fence() costs nothing in am mode (one ucp_worker_fence in rdma);
///     - put_signal and put_signal_nbi are one message in am mode (a put, a fence and the signal in
///       rdma), in flight on return: remote completion of data and signal at quiet()/flush(pe);
///       put_signal returns with `src` reusable, put_signal_nbi at once (`src` reusable after quiet() or
///       flush(pe)), like put_nbi;
///     - messages reach a target while it runs ubep code or its progress thread, which runs by default
///       wherever UCX is in use (UBEP_PROGRESS_THREAD=auto): a target that computes, or sits in a plain MPI call,
///       still answers; with UBEP_PROGRESS_THREAD=0 only its own ubep calls do (rdma mode on a hardware lane needs
///       no target CPU). While the application progresses UCX itself the thread stays away; it serves the worker
///       within about 10 ms of the application's last ubep call (docs/ROUTES.md, "The ucx route").
///  - Deferred signals: through MPI, put_signal_nbi and signal_op only record their signal. This rank's
///    next quiet(), flush(), fence(), wait, test*, progress(), put_signal or atomic "delivers" them: one
///    MPI_Win_flush per peer with data in flight, then every recorded signal (alloc, free, barrier and
///    finalize do it through quiet()). Signals are issued, never completed, by the delivery: they are
///    remotely complete at the next quiet() or flush(pe), and MPI usually delivers them before that.
///  - Ordering flush: on the mpi route a call may first flush pe (MPI_Win_flush(pe)) where MPI would not
///    order it after earlier calls: a fence() pending for pe, data in flight to pe before a signal or a
///    non-fetching atomic, an update of a word while an earlier one of it is in flight and one of the two
///    is an 8-byte signal put; and once 4096 signals and non-fetching atomics are in flight, every peer.
///  - GPU heap: for a symmetric address in the GPU heap (alloc_device) the notes of put, get, put_nbi, get_nbi,
///    put_signal and put_signal_nbi read instead:
///     - pe on this rank's node (node_ranks(), whatever route(pe) says for host memory): one cudaMemcpyAsync
///       on ubep's stream into (out of) pe's heap mapped here, no MPI; put, get, put_signal and
///       put_signal_nbi wait for it (local and remote completion on return), put_nbi and get_nbi complete at
///       the next quiet() or flush();
///     - pe on another node, with an MPI window over the GPU heap (UBEP_GPU_MPI_WINDOW: auto where every
///       rank's MPI is CUDA-aware, or forced with 1): MPI_Put/MPI_Get on that window with the mpi route's notes
///       (put_nbi/get_nbi issue only), and put, get, put_signal and put_signal_nbi complete it (MPI_Win_flush)
///       before they return; pe's MPI completes it while pe runs MPI or ubep code, at most UBEP_WAIT_TIMEOUT;
///     - pe on another node otherwise: the staged route: chunks of UBEP_GPU_STAGING_CHUNK, device -> host ->
///       pe's host route -> host -> device, at most 2 in flight per pair, each acknowledged by pe once it is on
///       pe's device. put, put_signal and put_signal_nbi return when every chunk is acknowledged (local and
///       remote completion), put_nbi at once (`src` unchanged until the next quiet() or flush(), which wait for
///       the acknowledgements). A get sends pe a request, and pe sends the data back the same way, straight into
///       `dest` (host or GPU memory): get returns with the data in `dest`, get_nbi at once (at most 4 per pair
///       outstanding: a fifth first waits for the oldest), completing at the next quiet() or flush(); pe reads
///       its GPU heap when it serves the request. pe acknowledges and serves only while it runs ubep code
///       (waits, test*, progress(), quiet(), collectives), or at any time from its progress thread
///       (the default, or UBEP_PROGRESS_THREAD=1) where the ranks of other nodes are on the ucx route; these calls
///       block at most
///       UBEP_WAIT_TIMEOUT, then throw Errc::timeout naming every pending chunk and get; the transfer goes on and a
///       later quiet() completes it;
///     - fence(), flush(), quiet(), signal_op and every put_signal first complete this rank's earlier device
///       copies and staged transfers, so a signal never overtakes GPU-heap data issued before it.
///  - "at most UBEP_WAIT_TIMEOUT": the call throws Errc::timeout when its deadline passes, as below.
///
/// Deadlines. Waits (wait_until*, and the MoE calls built on them) poll with the deadline
/// WaitOptions::timeout or UBEP_WAIT_TIMEOUT and throw Errc::timeout with a report. A wait reads the clock
/// first at its 16th poll (under the default UBEP_POLL, well under a microsecond after the call; at most
/// about a millisecond with sleep_max_us=64 and no spinning) and counts its deadline from there: a clock
/// read at the call cost a load/store ping-pong 10 ns per one-way trip. ubep's collectives
/// (the agreement in Context(), alloc, alloc_signals, Symmetric::free, barrier, agree, finalize) are
/// non-blocking MPI requests polled with UBEP_WAIT_TIMEOUT: when one times out, the rank asks every peer
/// (point to point, for at most min(1 s, timeout / 5)) which collective it is in, and the error names the
/// ranks that did not answer (dead, stalled, or outside ubep's collectives) and those in another collective;
/// after that the context runs no other collective (they throw Errc::timeout at once). On the mpi route the MPI calls
/// that may need the target's progress (MPI_Win_flush[_local], fetching atomics, accumulates) run on an internal worker
/// thread while the caller polls with UBEP_WAIT_TIMEOUT, as UBEP_MPI_BOUNDED says: by default every such
/// call to a peer whose route is mpi (on this host too), and fetching atomics to any peer; accumulates and
/// flushes to mapped (shm) peers run inline (MPI completes them through shared memory). With a thread level below
/// MPI_THREAD_MULTIPLE, UBEP_MPI_BOUNDED=off or UBEP_WAIT_TIMEOUT=0 they all run inline and unbounded
/// (UBEP_WAIT_TIMEOUT=0 also lifts the deadline of collectives, and of waits without WaitOptions::timeout).
/// An MPI call that timed out stays pending inside MPI (MPI cannot cancel it): the next such call first
/// waits for it, again with the deadline, so a peer that resumes heals the context, and buffers of the
/// timed-out operation may still be read or written until then. Plain MPI collectives have no deadline:
/// those that build the context (communicators, windows, the topology exchange) and free it (after the
/// agreement of finalize()), and moe::BspLayer's MPI_Alltoall[v]. Queues are bounded: on the ucx route
/// any call that starts an operation first waits, with the deadline, for half of this rank's operations in
/// flight once 16384 are (and flushes an rdma peer every 16384 operations), so 10^6 put_nbi before one
/// quiet() hold a few MB, not hundreds; MPI queues the mpi route's operations itself.
///
/// A call that timed out on the ucx route leaves its operation in flight like any other (nothing stays waited for):
/// a later quiet() or flush(pe) completes it once pe progresses, and until then the operation may still read its
/// source or write its destination (a blocking put's `src`, a get's `dest`).
///
/// Failed and untrusted peers. A peer whose endpoint fails (it died, or the network did) is unreachable: every
/// later operation to it throws Errc::unreachable at once, and this rank's other peers are served as before (the
/// answers owed to it are dropped, said once by Errc::unreachable from this rank's next call). Everything a peer
/// sends is checked before it is acted on (docs/RELIABILITY.md, "Trust"): a message that breaks the protocol (a corrupt
/// or forged one, a peer built from another version) is dropped, its sender isolated (its later messages dropped,
/// operations to it refused with Errc::protocol), and this rank's next call throws Errc::protocol naming the peer and
/// the field. Errors met by the progress thread are thrown by the application's next call, never in the thread.
///
/// Thread safety: a Context is used by one thread at a time (the optional progress thread is internal).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ubep/error.hpp"
#include "ubep/options.hpp"
#include "ubep/signal.hpp"
#include "ubep/stream.hpp"
#include "ubep/symmetric.hpp"

namespace ubep {

class Topology;

/// What a Context runs on, as seen by this rank (Context::info()); for tools such as ubep-info and for logs.
struct RuntimeInfo {
  /// MPI_WIN_MODEL of the node window (MPI_Win_allocate_shared: it holds the symmetric heap, so every
  /// context has one; the shm route maps it) and of the world window (MPI_Win_create over the same heap,
  /// for the mpi route): "MPI_WIN_UNIFIED", "MPI_WIN_SEPARATE", "unknown" (MPI did not say) or "none"
  /// (no such window: the world window is created, collectively, only when some rank's routes or
  /// atomics use MPI).
  std::string node_window_model;
  std::string world_window_model;
  /// route(pe) for every pe of the communicator.
  std::vector<Route> routes;
  /// The transports this rank uses, cheapest first: names of the routes in `routes`, plus "mpi" when the
  /// atomics go through MPI.
  std::vector<std::string> transports;
  /// The UCX library and mode when UCX is in use ("UCX 1.13.1, mode am (active messages)"), empty
  /// otherwise.
  std::string ucx;
  /// When UCX is in use, per pe: the mode UCX reaches it with, why, and the endpoint's lanes as UCX
  /// reports them, e.g. "am (auto: no lane has hardware RMA and atomics); lanes tcp/eth0.0[rma_bw am
  /// am_bw wireup]". Empty otherwise. (UCX reaches every peer when the atomics go through it.)
  std::vector<std::string> ucx_peers;
  /// This rank's progress thread: "none" (UBEP_PROGRESS_THREAD=0, or auto without UCX in use), "ucx: ..." (auto
  /// with UCX in use: the thread that sleeps on UCX's event fd and wakes when a message arrives) or "full: ..."
  /// (UBEP_PROGRESS_THREAD=1: MPI, UCX and the staged GPU route every UBEP_PROGRESS_INTERVAL_US).
  std::string progress_thread;
  /// The symmetric GPU heap (Context::alloc_device): "not created (...)" before the first alloc_device, then
  /// its size, device and how the node shares it.
  std::string gpu_heap;
  /// Per pe: how data in the GPU heap reaches it ("self", "CUDA IPC: ..." for the ranks of this node,
  /// "none: another node ..." otherwise).
  std::vector<std::string> gpu_peers;
};

/// The runtime for one communicator. Move-only; collective to create and to finalize.
class Context {
 public:
  /// Collective over `comm` (duplicated, so user traffic never mixes with ours). Initializes MPI with
  /// MPI_THREAD_MULTIPLE when the caller has not; then finalize() also finalizes MPI. Allocates the
  /// symmetric heap, maps node peers, builds the route table and the topology. Before the heap is allocated
  /// every rank checks that the heaps of its host fit in the shared-memory directory MPI backs shared
  /// windows with (/dev/shm, or OMPI_MCA_osc_sm_backing_directory); if one host lacks the space every
  /// rank throws OutOfHeap naming that host's rank, the bytes needed and the bytes free. When it throws
  /// after initializing MPI, MPI stays initialized (finalizing it is collective) and the next Context()
  /// takes it over: a retry, e.g. with a smaller UBEP_HEAP_SIZE, works, and its finalize() finalizes MPI.
  /// @note Local completion: on return the context is ready on this rank. Remote completion: no rank returns
  /// before every rank has joined the agreement on the settings. Blocks: until every rank of `comm` arrives;
  /// the agreement at most UBEP_WAIT_TIMEOUT, the plain MPI collectives around it (MPI_Comm_dup, communicator
  /// splits, allgathers, window creation, the topology exchange) without a deadline. Communicates: collective
  /// over `comm`.
  explicit Context(MPI_Comm comm = MPI_COMM_WORLD, Options options = Options::from_env());
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  /// Never throws and never communicates (it may run while an exception unwinds and peers are gone). A
  /// context not finalized stops its progress thread, becomes unusable (Errc::finalized), prints a
  /// warning, and leaves its MPI windows and communicators to MPI_Finalize (freeing them is collective);
  /// if this context initialized MPI, MPI stays initialized.
  /// @note Local completion: none: operations still outstanding are abandoned, not completed. Remote
  /// completion: none. Blocks: no (it joins the progress thread, if any). Communicates: no.
  ~Context();

  /// Collective: completes all operations, frees the heap and the windows, and finalizes MPI if this
  /// context initialized it. Every later call on this context or its objects throws Errc::finalized.
  /// When it throws (a peer never arrives: Errc::timeout), the progress thread is already stopped and
  /// the context is not finalized: call finalize() again, or let the destructor release it locally.
  /// @note Local completion: on return every operation of this rank is complete (quiet()) and the heap,
  /// windows and communicators are freed. Remote completion: no rank frees its windows before every rank has
  /// completed its outstanding operations and joined. Blocks: quiet(), then the agreement, at most
  /// UBEP_WAIT_TIMEOUT each; then MPI_Win_free, MPI_Comm_free and, if this context initialized MPI,
  /// MPI_Finalize, plain MPI collectives that every rank has reached by then. Communicates: collective over
  /// comm().
  void finalize();
  bool finalized() const noexcept;

  int rank() const;
  int size() const;
  /// The duplicated communicator ubep uses (for MPI baselines that must run on the same ranks).
  MPI_Comm comm() const;
  const Options& options() const;
  /// How this rank reaches `pe`.
  Route route(int pe) const;
  /// True when atomics and signals go through MPI for every peer (some peer is off-node, or forced).
  bool atomics_through_mpi() const;
  /// This rank's node (real or emulated) and the ranks on it.
  int node() const;
  std::span<const int> node_ranks() const;
  /// Who is close to whom; built at construction.
  const Topology& topology() const;
  /// The MPI thread level in force.
  int thread_level() const;

  // ---- collective memory ----------------------------------------------------------------------------
  /// Collective: `count` elements of T, aligned to max(64, alignof(T)) (at most 4096: larger alignments
  /// throw Errc::invalid_argument), same offset on every rank, uninitialized. count may be 0 (data() is
  /// then null). Every rank first completes its outstanding operations (quiet), so nothing aimed at an
  /// object destroyed earlier can land in the new one. Throws OutOfHeap naming UBEP_HEAP_SIZE, and
  /// Errc::collective_mismatch when ranks ask for different sizes or allocate in different orders.
  /// @note Class: collective: this rank's copy exists (uninitialized) on return.
  template <class T>
  [[nodiscard]] Symmetric<T> alloc(std::size_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    return Symmetric<T>(state_ptr(), static_cast<T*>(alloc_bytes(count, sizeof(T), alignof(T))), count);
  }
  /// Collective: `count` elements of T in the symmetric GPU heap (docs/GPU.md "GPUs"): device memory, aligned to
  /// max(256, alignof(T)), same offset on every rank, uninitialized; data() is a device pointer (never
  /// dereference it on the host: operator[] and local() do). The first call creates the heap of
  /// UBEP_GPU_HEAP_SIZE bytes on the CUDA device current on the calling thread (cudaSetDevice before it) and
  /// maps the heaps of this rank's node peers (CUDA IPC); every later call hands out objects in it. put, get,
  /// put_nbi, get_nbi, put_signal, put_signal_nbi and ptr() accept pointers into it for this rank and the
  /// ranks of its node (node_ranks(), whatever route() says for host memory; CUDA IPC), and for ranks of
  /// other nodes through an MPI window over the GPU heap where MPI is CUDA-aware (UBEP_GPU_MPI_WINDOW), else
  /// through the staged route ("GPU heap" above); atomics and signal words in it
  /// get Errc::not_symmetric (they live in the host heap: alloc, alloc_signals). When the job spans nodes, the
  /// first call also creates that window (collective), or takes the staged route's buffers from the host heap (4
  /// UBEP_GPU_STAGING_CHUNK per rank of the job). Throws, on every rank together: Errc::unsupported when some rank has
  /// no usable GPU, the build has no CUDA, or the ranks of a node cannot map each other's heaps (naming the rank and
  /// CUDA's answer; the context stays usable for host memory and a later call tries again); OutOfHeap naming
  /// UBEP_GPU_HEAP_SIZE; the errors of alloc.
  /// @note Class: collective (this rank's device copies complete too), except: Blocks: the first call also for the
  /// heap's creation and the exchange of CUDA IPC handles with the node, at most UBEP_WAIT_TIMEOUT.
  template <class T>
  [[nodiscard]] Symmetric<T> alloc_device(std::size_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    return Symmetric<T>(state_ptr(), static_cast<T*>(alloc_device_bytes(count, sizeof(T), alignof(T))), count);
  }
  /// Collective: `count` 64-bit signal words, set to `initial` on every rank before any rank returns.
  /// @note Class: collective, with two agreements: this rank's words hold `initial` on return, and no rank returns
  /// before every rank has set its words, so the initialization overwrites no peer's signal.
  [[nodiscard]] Symmetric<std::uint64_t> alloc_signals(std::size_t count, std::uint64_t initial = 0);
  /// Collective barrier with a timeout; for setup code only, never used by ubep's data path.
  /// @note Class: collective.
  void barrier();
  /// Collective: every rank passes the same `values` (at most 8) or every rank throws
  /// Errc::collective_mismatch naming `what`, the value names and their range across ranks. For layers
  /// built on ubep (the MoE setup) to check that all ranks were configured alike. `names` has one name per value,
  /// or none; another count throws Errc::invalid_argument on the calling rank, before any communication.
  /// @note Class: collective, except: it completes no outstanding operation (no quiet()); Blocks: until every rank
  /// joins, at most UBEP_WAIT_TIMEOUT.
  void agree(const char* what, std::initializer_list<std::int64_t> values, std::initializer_list<const char*> names);
  /// Bytes of symmetric heap still free (the largest block).
  std::size_t heap_free() const;

  // ---- RMA ------------------------------------------------------------------------------------------
  /// Copies `bytes` from local `src` to symmetric `dest` on `pe`.
  /// @note Class: blocking RMA.
  void put(void* dest, const void* src, std::size_t bytes, int pe);
  /// Copies `bytes` from symmetric `src` on `pe` to local `dest`.
  /// @note Class: blocking RMA (pe's memory is only read: no remote completion).
  void get(void* dest, const void* src, std::size_t bytes, int pe);
  /// Non-blocking put.
  /// @note Class: non-blocking RMA.
  void put_nbi(void* dest, const void* src, std::size_t bytes, int pe);
  /// Non-blocking get.
  /// @note Class: non-blocking RMA (pe's memory is only read: no remote completion).
  void get_nbi(void* dest, const void* src, std::size_t bytes, int pe);

  /// A local copy of `bytes` from `src` to `dst` (they must not overlap), each anywhere in this process's
  /// memory: host memory, the GPU heap, or device memory of the CUDA runtime (cudaMalloc, cudaMallocHost,
  /// managed memory). Once this rank has a GPU heap (alloc_device) it is a cudaMemcpyAsync with
  /// cudaMemcpyDefault on ubep's stream, then a wait for that stream (so it also completes this rank's
  /// earlier copies to node peers' GPU heaps); before that a memcpy, so device memory needs a GPU heap.
  /// Under UBEP_GPU_EMULATE=1 the GPU heap is host memory and every copy is a memcpy. Symmetric or not,
  /// nothing is checked but the pointers (null with bytes > 0: Errc::invalid_argument). moe::Layer moves
  /// device buffers with it (Config::memory).
  /// @note Class: local, except: Local completion: on return `dst` holds the bytes. Blocks: for the copy (the GPU's,
  /// when there is a GPU heap).
  void copy(void* dst, const void* src, std::size_t bytes);

  /// Where this rank can load and store `bytes` of symmetric `dest` on `pe` directly (OpenSHMEM's
  /// shmem_ptr): pe's copy mapped into this process when route(pe) is self or shm, null otherwise (mpi,
  /// ucx: use put and get). The range is checked like a put's (in the heap, inside one live object), once,
  /// so a loop that copies many pieces into one object pays one check instead of one per put. A store
  /// through the pointer is a put that is complete when the store is: pe sees it once it has synchronized
  /// with this rank, e.g. by waiting for a later put_signal or signal_op of this rank to pe (release and
  /// acquire, as for put). Atomics on such a word go through ubep (atomic_*), not through the pointer, when
  /// atomics_through_mpi() is true. The pointer is valid until the object is freed.
  /// @note Class: local (nothing is transferred; stores through the pointer are complete when they are).
  void* ptr(const void* dest, std::size_t bytes, int pe);
  /// ptr() for `count` elements of T.
  /// @note Class: local, as ptr(const void*, std::size_t, int).
  template <class T>
  T* ptr(T* dest, std::size_t count, int pe) {
    const std::size_t bytes =
        count > ~std::size_t{0} / sizeof(T) ? ~std::size_t{0} : count * sizeof(T);  // out of range
    return static_cast<T*>(ptr(static_cast<const void*>(dest), bytes, pe));
  }

  /// put() of a span.
  /// @note Class: blocking RMA, as put(void*, const void*, std::size_t, int).
  template <class T>
  void put(T* dest, std::span<const T> src, int pe) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(static_cast<void*>(dest), src.data(), src.size_bytes(), pe);
  }
  /// get() into a span.
  /// @note Class: blocking RMA, as get(void*, const void*, std::size_t, int).
  template <class T>
  void get(std::span<T> dest, const T* src, int pe) {
    static_assert(std::is_trivially_copyable_v<T>);
    get(dest.data(), static_cast<const void*>(src), dest.size_bytes(), pe);
  }

  /// Orders: operations to each peer before the fence are delivered before those after it, deferred
  /// signals included (the fence delivers them).
  /// @note Local completion: none of its own (delivering deferred signals completes the data in flight to the
  /// peers they follow). Remote completion: none: it only orders; on the mpi route lazily, the next operation
  /// to each peer that had operations in flight first flushes it (an ordering flush). Blocks: only to deliver
  /// deferred signals, at most UBEP_WAIT_TIMEOUT per MPI call; free otherwise. Communicates: only to deliver
  /// deferred signals.
  void fence();
  /// Completes every outstanding operation of this rank (puts, gets, atomics, signals; deferred signals
  /// are delivered first).
  /// @note Local completion: on return, for every operation issued before it. Remote completion: on return,
  /// for every operation issued before it. Blocks: mpi one MPI_Win_flush per peer with operations in flight,
  /// at most UBEP_WAIT_TIMEOUT each (a peer whose flush timed out stays outstanding, and the next quiet()
  /// flushes it again); self/shm a memory fence only; free when nothing is outstanding. Communicates: with
  /// every peer that has operations in flight (not collective).
  void quiet();
  /// Completes every outstanding operation to `pe`.
  /// @note Local completion: on return, for every operation to pe issued before it. Remote completion: on
  /// return, for every operation to pe issued before it (deferred signals: it delivers those to every peer,
  /// and completes those to pe). Blocks: mpi deferred signals delivered first, then MPI_Win_flush(pe), at
  /// most UBEP_WAIT_TIMEOUT each; free when nothing is outstanding to pe and no signal is deferred.
  /// Communicates: with pe; with other peers only to deliver deferred signals.
  void flush(int pe);
  /// Local completion of every operation to `pe` (like MPI_Win_flush_local): the sources of earlier
  /// put_nbi/put_signal_nbi to pe may be reused, the destinations of get_nbi from pe hold their data.
  /// Where a transport cannot complete operations locally alone it flushes (mpi: as flush(pe)). GPU heap: this
  /// rank's device copies and staged transfers are completed first (as quiet() does them), so the source of a
  /// GPU-heap put_nbi is reusable too.
  /// @note Local completion: on return, for every operation to pe issued before it. Remote completion: ucx
  /// none of its own (no round trip: it waits for UCX to be done with the sources); mpi and self/shm as
  /// flush(pe); GPU-heap transfers complete. Blocks: ucx until UCX is done with those sources (a rendezvous needs
  /// pe to progress), mpi as flush(pe), GPU-heap transfers until acknowledged, at most UBEP_WAIT_TIMEOUT; free
  /// when nothing is in flight to pe. Communicates: ucx no message of its own; mpi as flush(pe).
  void flush_local(int pe);

  // ---- atomics on 64-bit words (8-byte aligned symmetric addresses) -----------------------------------
  // Atomicity (docs/ROUTES.md "Atomics"): with load/store atomics (atomics_through_mpi() false) all kinds are
  // atomic with respect to each other; through MPI only one kind per word is (fetch_add/add, swap/set, or
  // compare_swap, each with fetch) among atomics that may overlap. This rank's own calls are checked: an atomic of
  // another kind while this rank's non-fetching atomic (add, set) on the word is still in flight throws
  // Errc::unsupported; quiet() or flush(pe) completes them and forgets their kind (a fetching atomic is complete on
  // return), so set, quiet(), barrier(), then compare_swap (an OpenSHMEM lock's release and take) is fine.
  // Every atomic first delivers this rank's deferred signals, so updates of one word stay in program order.

  /// Adds `value` to *dest on `pe`; returns the old value.
  /// @note Class: fetching atomic (MPI_Fetch_and_op through MPI).
  std::uint64_t atomic_fetch_add(std::uint64_t* dest, std::uint64_t value, int pe);
  /// Non-fetching add; atomic like the others.
  /// @note Class: non-fetching atomic.
  void atomic_add(std::uint64_t* dest, std::uint64_t value, int pe);
  /// Sets *dest to `desired` if it equals `expected`; returns the old value either way.
  /// @note Class: fetching atomic (MPI_Compare_and_swap through MPI).
  std::uint64_t atomic_compare_swap(std::uint64_t* dest, std::uint64_t expected, std::uint64_t desired, int pe);
  /// Sets *dest to `value`; returns the old value.
  /// @note Class: fetching atomic (MPI_Fetch_and_op through MPI).
  std::uint64_t atomic_swap(std::uint64_t* dest, std::uint64_t value, int pe);
  /// Reads *dest atomically.
  /// @note Class: fetching atomic (MPI_Fetch_and_op with MPI_NO_OP through MPI), except: Remote completion: none (the
  /// word is only read).
  std::uint64_t atomic_fetch(const std::uint64_t* dest, int pe);
  /// Non-fetching set.
  /// @note Class: non-fetching atomic.
  void atomic_set(std::uint64_t* dest, std::uint64_t value, int pe);

  // ---- signals -------------------------------------------------------------------------------------
  /// Puts `bytes` to `dest` on `pe`, then updates the signal `sig` on `pe` (set or add `value`). Any rank
  /// that observes this update also sees the data of this call.
  /// @note Local completion: on return (`src` may be reused). Remote completion: the data on return on every
  /// route (on mpi the call flushes pe before the signal); the signal with load/store atomics on return,
  /// through MPI it is issued at once and complete at the next quiet() or flush(pe). Blocks: load/store
  /// atomics no; through MPI deferred signals delivered first, an ordering flush (always when data to pe is
  /// in flight), then the signal (an 8-byte MPI_Put for a set under UBEP_MPI_SIGNAL=put, else
  /// MPI_Accumulate), at most UBEP_WAIT_TIMEOUT each. Communicates: with pe.
  void put_signal(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value, SignalOp op,
                  int pe);
  /// Non-blocking put_signal: through MPI the signal is deferred and delivered after one flush that
  /// covers all data puts (batching); any rank that observes it also sees the data of this call.
  /// @note Local completion: on return, except `src` for a pe on the mpi or ucx route: at the next quiet() or
  /// flush(pe). Remote completion: with load/store atomics data and signal on return; through MPI the data on
  /// the self/shm routes on return, the mpi route's data when the signal is delivered (this rank's next
  /// quiet(), flush(), fence(), wait, test*, progress(), put_signal or atomic), the signal at the next
  /// quiet() or flush(pe). Blocks: self/shm no; mpi only for an ordering flush (a pending fence()), at most
  /// UBEP_WAIT_TIMEOUT. Communicates: with pe.
  void put_signal_nbi(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value,
                      SignalOp op, int pe);
  /// A signal update alone, ordered after every earlier put and put_nbi of this rank (to any peer, no
  /// fence needed): with load/store atomics a release store (or add); through MPI deferred, and
  /// delivered after one flush per peer with data in flight; with UCX in use, after a flush of the other ucx
  /// peers that have puts of this rank in flight (one round trip for all of them), then one message to pe (the
  /// stream to pe orders it after the puts to pe); there a signal to this rank itself (pe == rank()) is ordered
  /// after this rank's puts to itself only, and never waits for a peer.
  /// @note Local completion: on return (nothing of the caller's is read later). Remote completion: with
  /// load/store atomics on return; through MPI delivered by this rank's next quiet(), flush(), fence(), wait,
  /// test*, progress(), put_signal or atomic, complete at the next quiet() or flush(pe); ucx at the next quiet() or
  /// flush(pe). Blocks: load/store, mpi and a signal to itself no; with UCX in use, for the flush of the other ucx
  /// peers with puts in flight (none: no wait), at most UBEP_WAIT_TIMEOUT (Errc::timeout naming the peer; with the
  /// default progress thread a computing peer still answers). Communicates: with pe (and those peers).
  void signal_op(std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe);
  /// The current value of a local signal (an acquire load).
  /// @note Class: local (an acquire load; unlike test, it neither delivers deferred signals nor lets MPI progress).
  std::uint64_t signal_fetch(const std::uint64_t* sig) const;

  /// Blocks until `*sig <cmp> value` holds for the local signal; returns the value observed. Throws
  /// Errc::timeout with a report (signal, value, condition, expected writers) when the deadline passes.
  /// @note Class: wait.
  std::uint64_t wait_until(const std::uint64_t* sig, Cmp cmp, std::uint64_t value, const WaitOptions& opts = {});
  /// Blocks until every signal in `sigs` satisfies the condition (an empty set returns at once).
  /// @note Class: wait, for every signal (an empty set returns at once and delivers nothing).
  void wait_until_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value, const WaitOptions& opts = {});
  /// Same, with one value per signal (`values.size() == sigs.size()`; kSignalIgnored leaves a signal out,
  /// and a set left empty returns at once).
  /// @note Class: wait, for every signal awaited (when none is awaited it returns at once and delivers nothing).
  void wait_until_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::span<const std::uint64_t> values,
                      const WaitOptions& opts = {});
  /// Blocks until at least one signal satisfies the condition; returns its index. An empty set throws
  /// Errc::invalid_argument.
  /// @note Class: wait, for the signal returned.
  std::size_t wait_until_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value,
                             const WaitOptions& opts = {});
  /// Same, with one value per signal; a set with every value kSignalIgnored throws as an empty one.
  /// @note Class: wait, for the signal returned.
  std::size_t wait_until_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::span<const std::uint64_t> values,
                             const WaitOptions& opts = {});
  /// Blocks until at least one signal satisfies the condition; returns the indices of all that do.
  /// @note Class: wait, for every signal returned.
  std::vector<std::size_t> wait_until_some(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value,
                                           const WaitOptions& opts = {});
  /// Same, with one value per signal.
  /// @note Class: wait, for every signal returned.
  std::vector<std::size_t> wait_until_some(std::span<const std::uint64_t> sigs, Cmp cmp,
                                           std::span<const std::uint64_t> values, const WaitOptions& opts = {});
  /// Whether the condition holds now for the local signal. test, test_all, test_any and test_some never
  /// wait for their condition.
  /// @note Class: test.
  bool test(const std::uint64_t* sig, Cmp cmp, std::uint64_t value);
  /// test for every signal of `sigs` (true for an empty set).
  /// @note Class: test.
  bool test_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value);
  /// The index of the first signal of `sigs` that satisfies the condition, if any.
  /// @note Class: test.
  std::optional<std::size_t> test_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value);
  /// The indices of every signal of `sigs` that satisfies the condition.
  /// @note Class: test.
  std::vector<std::size_t> test_some(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value);

  // ---- GPU streams (stream.hpp says what holds) --------------------------------------------------------
  /// When `stream` reaches this call: copies `bytes` from `src` (memory the GPU can read: device memory, or
  /// host memory that is pinned and mapped) to symmetric `dest` on `pe`, then updates the signal `sig` on
  /// `pe`; any rank that observes the update sees the data. `pe` must be reached by load/store (route self
  /// or shm with load/store atomics), else Errc::unsupported. A set is a release store at system scope from
  /// the GPU (payloads up to 64 KiB: one kernel, larger: the copy engines, then the store); an add is a CPU
  /// release add from a host callback of the stream. Throws as put_signal for bad arguments (rank, range,
  /// alignment), Errc::unsupported without a GPU (with gpu_status()'s reason) or in a build without ubep's
  /// kernels, Errc::cuda (CUDA's error code and name) when CUDA refuses a call.
  /// @note Class: stream-ordered: `src` is read when the stream reaches the call and must stay valid until then; data,
  /// then signal (cudaStreamSynchronize or an event after it tells when). The first stream call of the context also
  /// registers the node's host heaps with CUDA. Thread-safe: no (as every Context call).
  void put_signal_on_stream(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value,
                            SignalOp op, int pe, GpuStream stream);
  /// A signal update alone, when `stream` reaches it: after everything the stream did before (kernels,
  /// copies), as put_signal_on_stream with no data. Throws as put_signal_on_stream.
  /// @note Class: stream-ordered (a signal update alone).
  void signal_op_on_stream(std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe, GpuStream stream);
  /// Holds `stream` until the local signal satisfies `*sig <cmp> value` or the deadline (opts.timeout, else
  /// UBEP_WAIT_TIMEOUT; 0 = none) passes on the GPU's clock; either way the stream then goes on, and the
  /// returned StreamWait says which (its result() throws Errc::timeout with the report). The word is polled
  /// by the GPU with acquire loads at system scope: the data of the put_signal that satisfied it is visible
  /// to the work the stream runs after it. Throws as wait_until for bad arguments, and as
  /// put_signal_on_stream without a GPU or kernels.
  /// @note Class: stream-ordered, except: Local completion: on return the wait is enqueued; it ends when the stream
  /// reaches it and the condition holds or the deadline passes. Remote completion: none. Blocks: no (the stream does,
  /// one thread of one block, at most the deadline). Communicates: no.
  [[nodiscard]] StreamWait wait_until_on_stream(const std::uint64_t* sig, Cmp cmp, std::uint64_t value,
                                                GpuStream stream, const WaitOptions& opts = {});

  /// Lets MPI progress and delivers deferred signals; for long loops that do not otherwise call ubep.
  /// @note Class: test, without a condition: it delivers this rank's deferred signals and lets MPI progress.
  void progress();

  /// What this rank runs on (MPI window models, routes, transports in use), for tools and logs.
  RuntimeInfo info() const;

 private:
  friend struct detail::TestAccess;
  std::shared_ptr<detail::State> state_ptr() const;
  void* alloc_bytes(std::size_t count, std::size_t elem_size, std::size_t align);
  void* alloc_device_bytes(std::size_t count, std::size_t elem_size, std::size_t align);
  std::shared_ptr<detail::State> state_;
};

}  // namespace ubep
