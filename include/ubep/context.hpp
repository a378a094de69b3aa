/// \file context.hpp
/// ubep::Context: the global address space over one MPI communicator, and every data-movement call.
///
/// Addresses. Every rank holds a symmetric heap of Options::heap_size bytes. Collective allocations
/// (alloc, alloc_signals) return the same offset on every rank, so a local pointer into the heap names
/// the same object on every rank: `put(obj.data() + i, src, n, pe)` writes element i of obj on rank pe.
///
/// Completion, as in OpenSHMEM:
///  - blocking put/get/atomics are complete locally when they return (the source may be reused, the
///    destination of a get or the result of an atomic holds the data);
///  - put_nbi/get_nbi/put_signal_nbi return at once; the source may be reused, and the destination of a
///    get read, only after quiet() or flush(pe);
///  - quiet() completes every outstanding operation remotely; flush(pe) those to pe; fence() orders the
///    operations to each peer issued before it before those issued after it, and completes nothing.
///    All three are free when nothing is outstanding.
///
/// Deadlines. Nothing waits forever: every wait and every collective, and on the mpi route every MPI
/// call that may need the target's progress (MPI_Win_flush[_local], fetching atomics, accumulates),
/// throws Errc::timeout after UBEP_WAIT_TIMEOUT with a message naming the peer. On the mpi route those
/// MPI calls run on an internal worker thread while the caller polls (needs MPI_THREAD_MULTIPLE; with a
/// lower thread level, or UBEP_WAIT_TIMEOUT=0, they run inline and unbounded). An MPI call that timed
/// out stays pending inside MPI (MPI cannot cancel it): the next such call first waits for it, again
/// with the deadline, so a peer that resumes heals the context, and buffers of the timed-out operation
/// may still be read or written until then.
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
#include "ubep/symmetric.hpp"

namespace ubep {

class Topology;

/// What a Context runs on, as seen by this rank (Context::info()); for tools such as ubep-info and for logs.
struct RuntimeInfo {
  /// MPI_WIN_MODEL of the node window (the shm route's MPI_Win_allocate_shared) and of the world window
  /// (the mpi route's MPI_Win_create): "MPI_WIN_UNIFIED", "MPI_WIN_SEPARATE", "unknown" (MPI did not
  /// say) or "none" (this context has no such window: a transport list without shm, a single node...).
  std::string node_window_model;
  std::string world_window_model;
  /// route(pe) for every pe of the communicator.
  std::vector<Route> routes;
  /// The transports this rank uses, cheapest first: names of the routes in `routes`, plus "mpi" when the
  /// atomics go through MPI.
  std::vector<std::string> transports;
};

/// The runtime for one communicator. Move-only; collective to create and to finalize.
class Context {
 public:
  /// Collective over `comm` (duplicated, so user traffic never mixes with ours). Initializes MPI with
  /// MPI_THREAD_MULTIPLE when the caller has not; then finalize() also finalizes MPI. Allocates the
  /// symmetric heap, maps node peers, builds the route table and the topology.
  explicit Context(MPI_Comm comm = MPI_COMM_WORLD, Options options = Options::from_env());
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  /// Never throws and never communicates (it may run while an exception unwinds and peers are gone). A
  /// context not finalized stops its progress thread, becomes unusable (Errc::finalized), prints a
  /// warning, and leaves its MPI windows and communicators to MPI_Finalize (freeing them is collective);
  /// if this context initialized MPI, MPI stays initialized.
  ~Context();

  /// Collective: completes all operations, frees the heap and the windows, and finalizes MPI if this
  /// context initialized it. Every later call on this context or its objects throws Errc::finalized.
  /// When it throws (a peer never arrives: Errc::timeout), the progress thread is already stopped and
  /// the context is not finalized: call finalize() again, or let the destructor release it locally.
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
  template <class T>
  [[nodiscard]] Symmetric<T> alloc(std::size_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    return Symmetric<T>(state_ptr(), static_cast<T*>(alloc_bytes(count, sizeof(T), alignof(T))), count);
  }
  /// Collective: `count` 64-bit signal words, set to `initial` on every rank before any rank returns.
  [[nodiscard]] Symmetric<std::uint64_t> alloc_signals(std::size_t count, std::uint64_t initial = 0);
  /// Collective barrier with a timeout; for setup code only, never used by ubep's data path.
  void barrier();
  /// Collective: every rank passes the same `values` (at most 6) or every rank throws
  /// Errc::collective_mismatch naming `what`, the value names and their range across ranks. For layers
  /// built on ubep (the MoE setup) to check that all ranks were configured alike.
  void agree(const char* what, std::initializer_list<std::int64_t> values, std::initializer_list<const char*> names);
  /// Bytes of symmetric heap still free (the largest block).
  std::size_t heap_free() const;

  // ---- RMA ------------------------------------------------------------------------------------------
  /// Copies `bytes` from local `src` to symmetric `dest` on `pe`. Locally complete on return.
  void put(void* dest, const void* src, std::size_t bytes, int pe);
  /// Copies `bytes` from symmetric `src` on `pe` to local `dest`. Complete on return.
  void get(void* dest, const void* src, std::size_t bytes, int pe);
  /// Non-blocking put: `src` may be reused only after quiet()/flush(pe) (on self/shm it already may).
  void put_nbi(void* dest, const void* src, std::size_t bytes, int pe);
  /// Non-blocking get: `dest` holds the data only after quiet()/flush(pe).
  void get_nbi(void* dest, const void* src, std::size_t bytes, int pe);

  template <class T>
  void put(T* dest, std::span<const T> src, int pe) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(static_cast<void*>(dest), src.data(), src.size_bytes(), pe);
  }
  template <class T>
  void get(std::span<T> dest, const T* src, int pe) {
    static_assert(std::is_trivially_copyable_v<T>);
    get(dest.data(), static_cast<const void*>(src), dest.size_bytes(), pe);
  }

  /// Orders: operations to each peer before the fence are delivered before those after it, deferred
  /// signals included (on the mpi route the fence issues them, after one flush per peer with data in
  /// flight). Completes nothing else.
  void fence();
  /// Completes every outstanding operation (puts, gets, atomics, deferred signals) remotely.
  void quiet();
  /// Completes every outstanding operation to `pe` remotely.
  void flush(int pe);

  // ---- atomics on 64-bit words (8-byte aligned symmetric addresses) -----------------------------------
  // Fetching ones are complete on return. Atomicity (README "Atomics"): with load/store atomics
  // (atomics_through_mpi() false) all kinds are atomic with respect to each other; through MPI only one
  // kind per word is (fetch_add/add, swap/set, or compare_swap, each with fetch), which this rank's own
  // calls are checked for (Errc::unsupported).
  std::uint64_t atomic_fetch_add(std::uint64_t* dest, std::uint64_t value, int pe);
  /// Non-fetching add: complete remotely at the next quiet()/flush(pe); atomic like the others.
  void atomic_add(std::uint64_t* dest, std::uint64_t value, int pe);
  /// Sets *dest to `desired` if it equals `expected`; returns the old value either way.
  std::uint64_t atomic_compare_swap(std::uint64_t* dest, std::uint64_t expected, std::uint64_t desired, int pe);
  std::uint64_t atomic_swap(std::uint64_t* dest, std::uint64_t value, int pe);
  std::uint64_t atomic_fetch(const std::uint64_t* dest, int pe);
  /// Non-fetching set: complete remotely at the next quiet()/flush(pe).
  void atomic_set(std::uint64_t* dest, std::uint64_t value, int pe);

  // ---- signals -------------------------------------------------------------------------------------
  /// Puts `bytes` to `dest` on `pe`, then updates the signal `sig` on `pe` (set or add `value`). Any rank
  /// that observes this update also sees the data of this call. Locally complete on return; the signal is
  /// on its way (delivered without further calls on the self/shm routes, issued at once on mpi).
  void put_signal(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value, SignalOp op,
                  int pe);
  /// Non-blocking put_signal. `src` may be reused after quiet()/flush(pe). On the mpi route the signal
  /// is held back and issued after one flush that covers all data puts (batching): it is delivered at the
  /// latest by this rank's next quiet(), flush(pe), wait or test.
  void put_signal_nbi(void* dest, const void* src, std::size_t bytes, std::uint64_t* sig, std::uint64_t value,
                      SignalOp op, int pe);
  /// A signal update alone, ordered after every earlier put and put_nbi of this rank (to any peer, no
  /// fence needed): on load/store it is a release store, on the mpi route it is held back and issued
  /// after one flush per peer with data in flight. Delivered like put_signal_nbi's signal.
  void signal_op(std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe);
  /// The current value of a local signal (an acquire load).
  std::uint64_t signal_fetch(const std::uint64_t* sig) const;

  /// Blocks until `*sig <cmp> value` holds for the local signal; returns the value observed. Throws
  /// Errc::timeout with a report (signal, value, condition, expected writers) when the deadline passes.
  /// Every wait, also one whose condition already holds, first delivers this rank's deferred signals
  /// and, when some peer is on the mpi route, calls MPI_Win_sync before it returns.
  std::uint64_t wait_until(const std::uint64_t* sig, Cmp cmp, std::uint64_t value, const WaitOptions& opts = {});
  /// Blocks until every signal in `sigs` satisfies the condition.
  void wait_until_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value, const WaitOptions& opts = {});
  /// Same, with one value per signal (`values.size() == sigs.size()`).
  void wait_until_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::span<const std::uint64_t> values,
                      const WaitOptions& opts = {});
  /// Blocks until at least one signal satisfies the condition; returns its index.
  std::size_t wait_until_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value,
                             const WaitOptions& opts = {});
  std::size_t wait_until_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::span<const std::uint64_t> values,
                             const WaitOptions& opts = {});
  /// Blocks until at least one signal satisfies the condition; returns the indices of all that do.
  std::vector<std::size_t> wait_until_some(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value,
                                           const WaitOptions& opts = {});
  std::vector<std::size_t> wait_until_some(std::span<const std::uint64_t> sigs, Cmp cmp,
                                           std::span<const std::uint64_t> values, const WaitOptions& opts = {});
  /// Whether the condition holds now (test), the index of one signal that satisfies it (test_any), the
  /// indices of all that do (test_some), whether all do (test_all). They never wait for the condition
  /// or for a peer's action. They do deliver this rank's deferred signals (the promise of
  /// put_signal_nbi and signal_op), which on the mpi route first completes the data puts those signals
  /// follow: an MPI_Win_flush per peer with data in flight, a network round trip, bounded by
  /// UBEP_WAIT_TIMEOUT like every blocking MPI call. With no deferred signal they only read the words
  /// and let MPI progress (MPI_Win_sync + MPI_Iprobe).
  bool test(const std::uint64_t* sig, Cmp cmp, std::uint64_t value);
  bool test_all(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value);
  std::optional<std::size_t> test_any(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value);
  std::vector<std::size_t> test_some(std::span<const std::uint64_t> sigs, Cmp cmp, std::uint64_t value);

  /// Lets MPI progress and delivers deferred signals; for long loops that do not otherwise call ubep.
  void progress();

  /// What this rank runs on (MPI window models, routes, transports in use), for tools and logs.
  RuntimeInfo info() const;

 private:
  std::shared_ptr<detail::State> state_ptr() const;
  void* alloc_bytes(std::size_t count, std::size_t elem_size, std::size_t align);
  std::shared_ptr<detail::State> state_;
};

}  // namespace ubep
