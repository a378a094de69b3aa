#include "ubep/context.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

#include "base/log.hpp"
#include "base/mpi_check.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/gpu_streams.hpp"
#include "runtime/state.hpp"
#include "ubep/config.hpp"
#include "ubep/gpu.hpp"
#if UBEP_HAVE_UCX
#include "transports/ucx/ucx_transport.hpp"
#endif

namespace ubep {
namespace detail {

std::string State::prefix(const char* call) const { return message_prefix(comms.rank, call); }

void State::fail(Errc code, const char* call, const std::string& what) const { throw Error(code, prefix(call) + what); }

std::size_t check_heap_range(const State& s, const char* call, const void* addr, std::size_t bytes, const char* base,
                             std::size_t size, const HeapAllocator& heap, const char* name, const char* hint) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const auto b = reinterpret_cast<std::uintptr_t>(base);
  if (addr == nullptr || a < b || a >= b + size) {
    std::ostringstream msg;
    msg << "address " << addr << " is not in the " << name << " [" << static_cast<const void*>(base) << ", +" << size
        << " bytes); " << hint;
    s.fail(Errc::not_symmetric, call, msg.str());
  }
  const std::size_t off = a - b;
  if (bytes > size - off) {
    s.fail(Errc::out_of_range, call,
           "[offset " + std::to_string(off) + ", +" + std::to_string(bytes) + " bytes) runs past the end of the " +
               std::to_string(size) + "-byte " + name);
  }
  const auto block = heap.find(off);
  if (!block) {
    s.fail(Errc::out_of_range, call,
           std::string(name) + " offset " + std::to_string(off) +
               " is not inside a live symmetric object (freed, or never allocated)");
  }
  if (bytes > block->offset + block->size - off) {
    s.fail(Errc::out_of_range, call,
           "[offset " + std::to_string(off) + ", +" + std::to_string(bytes) +
               " bytes) runs past the end of its object [" + std::to_string(block->offset) + ", " +
               std::to_string(block->offset + block->size) + ")");
  }
  return off;
}

std::size_t State::check_range_slow(const char* call, const void* addr, std::size_t bytes) const {
  if (device_holds(addr)) {
    std::ostringstream msg;
    msg << "address " << addr << " is in the symmetric GPU heap; " << call
        << " takes host memory here (signal words and atomics live in the host heap: Context::alloc, alloc_signals)";
    fail(Errc::not_symmetric, call, msg.str());
  }
  return check_heap_range(*this, call, addr, bytes, heap.base, heap.size, heap.alloc, "symmetric heap",
                          "pass a pointer into an object from Context::alloc");
}

void State::fail_misaligned(const char* call, const void* addr) const {
  std::ostringstream msg;
  msg << "address " << addr << " is not 8-byte aligned (64-bit atomics and signals need an aligned word)";
  fail(Errc::misaligned, call, msg.str());
}

namespace {
const char* family_name(AtomicFamily f) {
  switch (f) {
    case AtomicFamily::sum: return "fetch_add/add (MPI_SUM)";
    case AtomicFamily::replace: return "swap/set (MPI_REPLACE)";
    case AtomicFamily::cas: return "compare_swap (MPI_Compare_and_swap)";
    case AtomicFamily::any: break;
  }
  return "fetch (MPI_NO_OP)";
}
}  // namespace

std::size_t State::prepare_atomic(const char* call, const void* addr, int pe, AtomicFamily family, bool fetching) {
  check_alive(call);
  check_pe(call, pe);
  const std::size_t off = check_word(call, addr);
  if (family != AtomicFamily::any && routes.mpi && routes.atomics == routes.mpi.get()) {
    // MPI makes accumulates atomic with respect to each other only when they use one op (or
    // MPI_NO_OP) on a word: the world window says so (accumulate_ops=same_op_no_op). One kind per
    // target word while this rank's non-fetching atomics on it (add, set) are in flight: they are recorded until
    // quiet() or flush(pe) completes them; a fetching atomic is complete on return and records nothing.
    const std::uint64_t key = static_cast<std::uint64_t>(off) * static_cast<std::uint64_t>(comms.size) + pe;
    const auto it = in_flight.atomic_family.find(key);
    if (it == in_flight.atomic_family.end()) {
      if (!fetching) in_flight.atomic_family.emplace(key, family);
    } else if (it->second != family) {
      fail(Errc::unsupported, call,
           "the word at heap offset " + std::to_string(off) + " on rank " + std::to_string(pe) +
               " was updated by this rank with " + family_name(it->second) +
               " (a non-fetching atomic, still in flight: no quiet() or flush(" + std::to_string(pe) +
               ") since); on the mpi route MPI makes " +
               "atomics on one word atomic with respect to each other only if they use one kind: " +
               "fetch_add/add, or swap/set, or compare_swap, each with fetch. Separate the kinds by synchronization: " +
               "quiet() or flush(pe) here, then whatever orders the other ranks' atomics (a barrier, a signal) " +
               "(docs/ROUTES.md, \"Atomics\")");
    }
  }
  flush_pending_signals();  // atomics and deferred signals on one word stay in program order
  return off;
}

bool State::release(std::size_t offset) noexcept {
  if (!in_flight.atomic_family.empty()) {
    if (const auto block = heap.alloc.find(offset)) {
      const auto P = static_cast<std::uint64_t>(comms.size);
      in_flight.atomic_family.erase(in_flight.atomic_family.lower_bound(block->offset * P),
                                    in_flight.atomic_family.lower_bound((block->offset + block->size) * P));
    }
  }
  return heap.alloc.release(offset);
}

State::~State() { stop_progress_thread(); }

void State::teardown() noexcept {
  stop_progress_thread();
  gpu.streams.reset();  // CUDA's registrations of the heaps go before the windows that hold them
  gpu.staged = nullptr;
  gpu.thread_staged = nullptr;
  gpu.window = nullptr;
  if (gpu.memory) gpu.memory->close_window();  // collective, like the windows below
  gpu.memory.reset();  // the GPU heaps: this rank's and the node peers' mappings, the staged route (device.cpp)
  gpu.base = nullptr;
  gpu.size = 0;
  routes.ucx.reset();  // local: every rank quiesced before the agreement of finalize()
  if (routes.mpi) routes.mpi->close();
  if (heap.world_win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(heap.world_win);
    MPI_Win_free(&heap.world_win);
  }
  if (heap.node_win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(heap.node_win);
    MPI_Win_free(&heap.node_win);
  }
  for (MPI_Comm* c : {&comms.progress_comm, &comms.signal_comm, &comms.node_comm, &comms.comm}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  heap.base = nullptr;
}

void release_symmetric(State& state, void* ptr) noexcept {
  if (state.finalized || state.heap.base == nullptr) return;
  if (state.device_holds(ptr)) {
    state.release_device(static_cast<char*>(ptr) - state.gpu.base);
    return;
  }
  state.release(static_cast<char*>(ptr) - state.heap.base);
}

void free_symmetric(State& state, void* ptr) {
  state.check_alive("free");
  const bool device = state.device_holds(ptr);
  const std::size_t off =
      device ? static_cast<std::size_t>(static_cast<char*>(ptr) - state.gpu.base) : state.check_range("free", ptr, 0);
  state.quiet();
  state.collective("free", CollKind::free, {static_cast<std::int64_t>(off), device ? 1 : 0},
                   {"offset", "heap (0 host, 1 GPU)"});
  if (!(device ? state.release_device(off) : state.release(off)))
    state.fail(Errc::internal, "free", "object at offset " + std::to_string(off) + " is not live");
}

}  // namespace detail

using detail::State;

const char* to_string(Route route) noexcept {
  switch (route) {
    case Route::self: return "self";
    case Route::shm: return "shm";
    case Route::mpi: return "mpi";
    case Route::ucx: return "ucx";
  }
  return "?";
}

Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;

Context::~Context() {
  if (!state_ || state_->finalized) return;
  // Never communicates (it may run while an exception unwinds and peers are gone): the progress thread
  // stops, the context and its objects become unusable, and the MPI windows and communicators are
  // left to MPI_Finalize, since freeing them is collective.
  state_->stop_progress_thread();
  state_->finalized = true;
  detail::warn(
      state_->comms.rank, "~Context",
      std::string("the context was not finalized (call finalize() on every rank); released local resources only") +
          (std::uncaught_exceptions() ? " while an exception unwinds" : ""));
}

void Context::finalize() {
  State& s = *state_;
  s.check_alive("finalize");
  try {
    s.quiet();
    s.collective("finalize", detail::CollKind::finalize, {});
    // Signals as messages: every one sent is received before the channel goes (none left to MPI at teardown).
    s.apply_sent_signal_messages("finalize");
  } catch (...) {
    s.stop_progress_thread();  // the context stays usable for another finalize(); the thread never outlives it
    throw;
  }
  s.teardown();
  s.finalized = true;
  if (s.comms.owns_mpi) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
}

bool Context::finalized() const noexcept { return !state_ || state_->finalized; }
int Context::rank() const { return state_->comms.rank; }
int Context::size() const { return state_->comms.size; }
MPI_Comm Context::comm() const {
  state_->check_alive("comm");
  return state_->comms.comm;
}
const Options& Context::options() const { return state_->options; }
Route Context::route(int pe) const {
  state_->check_pe("route", pe);
  return state_->routes.route[pe];
}
bool Context::atomics_through_mpi() const {
  return state_->routes.mpi && state_->routes.atomics == state_->routes.mpi.get();
}
int Context::node() const { return state_->comms.node_id; }
std::span<const int> Context::node_ranks() const { return state_->comms.node_ranks; }
const Topology& Context::topology() const { return state_->topology; }
int Context::thread_level() const { return state_->comms.thread_level; }
namespace {
std::string memory_model(MPI_Win win) {
  if (win == MPI_WIN_NULL) return "none";
  int* model = nullptr;
  int flag = 0;
  if (MPI_Win_get_attr(win, MPI_WIN_MODEL, &model, &flag) != MPI_SUCCESS || !flag || !model) return "unknown";
  return *model == MPI_WIN_UNIFIED ? "MPI_WIN_UNIFIED" : "MPI_WIN_SEPARATE";
}
}  // namespace

RuntimeInfo Context::info() const {
  const State& s = *state_;
  s.check_alive("info");
  RuntimeInfo out;
  out.node_window_model = memory_model(s.heap.node_win);
  out.world_window_model = memory_model(s.heap.world_win);
  out.routes = s.routes.route;
  if (s.routes.ucx) {
    out.ucx = s.routes.ucx->describe();
    out.ucx_peers.resize(s.comms.size);
    for (int pe = 0; pe < s.comms.size; ++pe) out.ucx_peers[pe] = s.routes.ucx->describe_peer(pe);
  }
  for (Route r : {Route::self, Route::shm, Route::ucx, Route::mpi}) {
    const bool used = std::find(s.routes.route.begin(), s.routes.route.end(), r) != s.routes.route.end() ||
                      (r == Route::mpi && s.routes.mpi && s.routes.atomics == s.routes.mpi.get()) ||
                      (r == Route::ucx && s.routes.ucx && s.routes.atomics == s.routes.ucx.get());
    if (used) out.transports.emplace_back(to_string(r));
  }
  out.progress_thread = s.progress_thread.kind;
  out.gpu_heap = detail::gpu_heap_description(s);
  for (int pe = 0; pe < s.comms.size; ++pe) out.gpu_peers.push_back(detail::gpu_path(s, pe));
  return out;
}
std::shared_ptr<detail::State> Context::state_ptr() const { return state_; }

namespace detail {

std::size_t alloc_request(const State& s, const char* call, std::size_t count, std::size_t elem_size,
                          std::size_t& align, std::size_t min_align) {
  s.check_alive(call);
  if (elem_size != 0 && count > (std::size_t{1} << 62) / elem_size) {
    s.fail(
        Errc::overflow, call,
        std::to_string(count) + " elements of " + std::to_string(elem_size) + " bytes overflow the size computation");
  }
  align = std::max(align, min_align);
  if (align > kHeapAlign) {
    s.fail(Errc::invalid_argument, call,
           "alignment " + std::to_string(align) + " exceeds the heap's alignment of " + std::to_string(kHeapAlign) +
               " bytes");
  }
  return count * elem_size;
}

std::optional<std::size_t> alloc_agreed(State& s, const char* call, CollKind kind, HeapAllocator& heap,
                                        std::size_t bytes, std::size_t align) {
  std::optional<std::size_t> off;
  if (bytes) off = heap.allocate(bytes, align);
  const std::int64_t where = bytes == 0 ? -2 : (off ? static_cast<std::int64_t>(*off) : -1);
  try {
    s.collective(call, kind, {static_cast<std::int64_t>(bytes), where}, {"bytes", "offset"});
  } catch (...) {
    if (off) heap.release(*off);
    throw;
  }
  return off;
}

void throw_out_of_heap(const State& s, const char* call, const HeapAllocator& heap, std::size_t heap_size,
                       const char* env, std::size_t bytes, std::size_t align) {
  // What the live objects hold (whole slots) plus this request; when that fits in the heap already, the
  // free space is fragmented, and only a heap larger by the request is sure to hold it.
  const std::size_t want = HeapAllocator::slots(bytes) + (align - HeapAllocator::kSlot);
  std::size_t needed = heap.bytes_reserved() + want;
  const bool fragmented = needed <= heap_size;
  if (fragmented) needed = heap_size + want;
  needed = (needed + kHeapAlign - 1) & ~(kHeapAlign - 1);
  throw OutOfHeap(s.prefix(call) + std::to_string(bytes) + " bytes requested, the largest free block is " +
                  std::to_string(heap.largest_free()) + " of " + env + "=" + std::to_string(heap_size) + " bytes (" +
                  std::to_string(heap.live_count()) + " live objects hold " + std::to_string(heap.bytes_reserved()) +
                  ", " + std::to_string(heap.free_bytes()) + " free" + (fragmented ? " but fragmented" : "") +
                  "); set " + env + " to at least " + std::to_string(needed));
}

}  // namespace detail

void* Context::alloc_bytes(std::size_t count, std::size_t elem_size, std::size_t align) {
  State& s = *state_;
  const std::size_t bytes = detail::alloc_request(s, "alloc", count, elem_size, align, 64);
  // A block freed earlier (Symmetric's destructor releases locally) may be handed out again below:
  // every rank completes its own operations before the collective, so none of them can land in the
  // new object (puts or gets aimed at the old one).
  s.quiet();
  const std::optional<std::size_t> off =
      detail::alloc_agreed(s, "alloc", detail::CollKind::alloc, s.heap.alloc, bytes, align);
  // Signal messages (UBEP_MPI_SIGNAL=message) land when applied here, not at the sender's quiet(): the
  // ones sent before the collective are applied now, so none changes a word of the new object later.
  s.apply_sent_signal_messages("alloc");
  if (bytes == 0) return nullptr;
  if (!off) detail::throw_out_of_heap(s, "alloc", s.heap.alloc, s.heap.size, "UBEP_HEAP_SIZE", bytes, align);
  return s.heap.base + *off;
}

Symmetric<std::uint64_t> Context::alloc_signals(std::size_t count, std::uint64_t initial) {
  Symmetric<std::uint64_t> sig = alloc<std::uint64_t>(count);
  for (std::size_t i = 0; i < count; ++i)
    std::atomic_ref<std::uint64_t>(sig[i]).store(initial, std::memory_order_relaxed);
  // No rank may signal into this array before every rank has initialized its copy.
  state_->collective("alloc_signals", detail::CollKind::signals, {static_cast<std::int64_t>(count)}, {"count"});
  return sig;
}

void Context::barrier() {
  state_->check_alive("barrier");
  state_->quiet();
  state_->collective("barrier", detail::CollKind::barrier, {});
  state_->apply_sent_signal_messages("barrier");
}

void Context::agree(const char* what, std::initializer_list<std::int64_t> values,
                    std::initializer_list<const char*> names) {
  state_->check_alive(what);
  if (names.size() != 0 && names.size() != values.size()) {
    state_->fail(Errc::invalid_argument, what,
                 std::to_string(names.size()) + " names given for " + std::to_string(values.size()) +
                     " values (agree takes one name per value, or none)");
  }
  state_->collective(what, detail::CollKind::user, values, names);
}

std::size_t Context::heap_free() const { return state_->heap.alloc.largest_free(); }

void Context::put(void* dest, const void* src, std::size_t bytes, int pe) {
  State& s = *state_;
  s.check_alive("put");
  s.check_pe("put", pe);
  if (bytes == 0) return;
  if (s.device_holds(dest)) return s.device_put("put", dest, src, bytes, pe, true);
  const std::size_t off = s.check_range("put", dest, bytes);
  if (char* m = s.routes.mapped[pe]) {
    std::memcpy(m + off, src, bytes);  // self, shm: what the load/store transport does, without the virtual call
    return;
  }
  s.data_route(pe).put(off, src, bytes, pe);
}

void Context::get(void* dest, const void* src, std::size_t bytes, int pe) {
  State& s = *state_;
  s.check_alive("get");
  s.check_pe("get", pe);
  if (bytes == 0) return;
  if (s.device_holds(src)) return s.device_get("get", dest, src, bytes, pe, true);
  const std::size_t off = s.check_range("get", src, bytes);
  if (const char* m = s.routes.mapped[pe]) {
    std::memcpy(dest, m + off, bytes);
    return;
  }
  s.data_route(pe).get(dest, off, bytes, pe);
}

void Context::put_nbi(void* dest, const void* src, std::size_t bytes, int pe) {
  State& s = *state_;
  s.check_alive("put_nbi");
  s.check_pe("put_nbi", pe);
  if (bytes == 0) return;
  if (s.device_holds(dest)) return s.device_put("put_nbi", dest, src, bytes, pe, false);
  const std::size_t off = s.check_range("put_nbi", dest, bytes);
  if (char* m = s.routes.mapped[pe]) {
    std::memcpy(m + off, src, bytes);  // complete at once on self and shm
    return;
  }
  s.data_route(pe).put_nbi(off, src, bytes, pe);
}

void Context::get_nbi(void* dest, const void* src, std::size_t bytes, int pe) {
  State& s = *state_;
  s.check_alive("get_nbi");
  s.check_pe("get_nbi", pe);
  if (bytes == 0) return;
  if (s.device_holds(src)) return s.device_get("get_nbi", dest, src, bytes, pe, false);
  const std::size_t off = s.check_range("get_nbi", src, bytes);
  if (const char* m = s.routes.mapped[pe]) {
    std::memcpy(dest, m + off, bytes);
    return;
  }
  s.data_route(pe).get_nbi(dest, off, bytes, pe);
}

void* Context::ptr(const void* dest, std::size_t bytes, int pe) {
  State& s = *state_;
  s.check_alive("ptr");
  s.check_pe("ptr", pe);
  if (s.device_holds(dest)) return s.device_ptr("ptr", dest, bytes, pe);
  const std::size_t off = s.check_range("ptr", dest, bytes);
  return s.routes.mapped[pe] ? s.routes.mapped[pe] + off : nullptr;
}

void Context::fence() {
  State& s = *state_;
  s.check_alive("fence");
  // Deferred signals were issued before the fence in program order: they go out now, so nothing issued
  // after the fence (a put that overwrites their data) can overtake them.
  s.flush_pending_signals();
  s.complete_device("fence");
  s.routes.load_store->fence();
  if (s.routes.ucx) s.routes.ucx->fence();
  if (s.routes.mpi) s.routes.mpi->fence();
}

void Context::quiet() {
  state_->check_alive("quiet");
  state_->quiet();
}

void Context::flush_local(int pe) {
  State& s = *state_;
  s.check_alive("flush_local");
  s.check_pe("flush_local", pe);
  // ucx: no message (its signals are never deferred); mpi: a flush; self/shm: complete already. GPU-heap data
  // first: a device copy or a staged transfer reads its source until it is complete (synchronize_device).
  if (s.routes.route[pe] == Route::ucx) {
    s.complete_device("flush_local");
    s.routes.ucx->flush_local(pe);
  } else {
    flush(pe);
  }
}

void Context::flush(int pe) {
  State& s = *state_;
  s.check_alive("flush");
  s.check_pe("flush", pe);
  s.flush_pending_signals();
  s.complete_device("flush");
  s.routes.load_store->flush_all();
  if (s.routes.ucx) s.routes.ucx->flush(pe);
  if (s.routes.mpi) s.routes.mpi->flush(pe);
  // This rank's atomics to pe are complete: a later one of another kind on the same word cannot overlap them.
  if (!s.in_flight.atomic_family.empty()) {
    std::erase_if(s.in_flight.atomic_family, [&](const auto& kv) {
      return kv.first % static_cast<std::uint64_t>(s.comms.size) == static_cast<std::uint64_t>(pe);
    });
  }
}

std::uint64_t Context::atomic_fetch_add(std::uint64_t* dest, std::uint64_t value, int pe) {
  const std::size_t off = state_->prepare_atomic("atomic_fetch_add", dest, pe, detail::AtomicFamily::sum, true);
  return state_->fetch_atomic(detail::AtomicOp::fetch_add, off, value, 0, pe);
}

void Context::atomic_add(std::uint64_t* dest, std::uint64_t value, int pe) {
  const std::size_t off = state_->prepare_atomic("atomic_add", dest, pe, detail::AtomicFamily::sum, false);
  state_->atomics_of(pe).post_atomic(detail::AtomicOp::add, off, value, pe);
}

std::uint64_t Context::atomic_compare_swap(std::uint64_t* dest, std::uint64_t expected, std::uint64_t desired, int pe) {
  const std::size_t off = state_->prepare_atomic("atomic_compare_swap", dest, pe, detail::AtomicFamily::cas, true);
  return state_->fetch_atomic(detail::AtomicOp::compare_swap, off, desired, expected, pe);
}

std::uint64_t Context::atomic_swap(std::uint64_t* dest, std::uint64_t value, int pe) {
  const std::size_t off = state_->prepare_atomic("atomic_swap", dest, pe, detail::AtomicFamily::replace, true);
  return state_->fetch_atomic(detail::AtomicOp::swap, off, value, 0, pe);
}

std::uint64_t Context::atomic_fetch(const std::uint64_t* dest, int pe) {
  const std::size_t off = state_->prepare_atomic("atomic_fetch", dest, pe, detail::AtomicFamily::any, true);
  return state_->fetch_atomic(detail::AtomicOp::fetch, off, 0, 0, pe);
}

void Context::atomic_set(std::uint64_t* dest, std::uint64_t value, int pe) {
  const std::size_t off = state_->prepare_atomic("atomic_set", dest, pe, detail::AtomicFamily::replace, false);
  state_->atomics_of(pe).post_atomic(detail::AtomicOp::set, off, value, pe);
}

}  // namespace ubep
