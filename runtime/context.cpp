#include "ubep/context.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
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
#include "topology/discover.hpp"

namespace ubep {
namespace detail {

std::string State::prefix(const char* call) const { return message_prefix(rank, call); }

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
  return check_heap_range(*this, call, addr, bytes, base, heap_size, heap, "symmetric heap",
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
  if (family != AtomicFamily::any && mpi && atomics == mpi.get()) {
    // MPI makes accumulates atomic with respect to each other only when they use one op (or
    // MPI_NO_OP) on a word: the world window says so (accumulate_ops=same_op_no_op). One kind per
    // target word while this rank's non-fetching atomics on it (add, set) are in flight: they are recorded until
    // quiet() or flush(pe) completes them; a fetching atomic is complete on return and records nothing.
    const std::uint64_t key = static_cast<std::uint64_t>(off) * static_cast<std::uint64_t>(size) + pe;
    const auto it = atomic_family.find(key);
    if (it == atomic_family.end()) {
      if (!fetching) atomic_family.emplace(key, family);
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
  if (!atomic_family.empty()) {
    if (const auto block = heap.find(offset)) {
      const auto P = static_cast<std::uint64_t>(size);
      atomic_family.erase(atomic_family.lower_bound(block->offset * P),
                          atomic_family.lower_bound((block->offset + block->size) * P));
    }
  }
  return heap.release(offset);
}

void State::stop_progress_thread() noexcept {
  progress_stop = true;
  if (progress_wake_fd >= 0) {
    const std::uint64_t one = 1;
    (void)!::write(progress_wake_fd, &one, sizeof one);  // the ucx thread sleeps in poll(): wake it
  }
  if (progress_thread.joinable()) progress_thread.join();
  if (progress_wake_fd >= 0) ::close(progress_wake_fd);
  progress_wake_fd = -1;
}

State::~State() { stop_progress_thread(); }

void State::teardown() noexcept {
  stop_progress_thread();
  gpu_streams.reset();  // CUDA's registrations of the heaps go before the windows that hold them
  staged = nullptr;
  thread_staged = nullptr;
  device_window = nullptr;
  if (device) device->close_window();  // collective, like the windows below
  device.reset();  // the GPU heaps: this rank's and the node peers' mappings, the staged route (device.cpp)
  device_base = nullptr;
  device_size = 0;
  ucx.reset();  // local: every rank quiesced before the agreement of finalize()
  if (mpi) mpi->close();
  if (world_win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(world_win);
    MPI_Win_free(&world_win);
  }
  if (node_win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(node_win);
    MPI_Win_free(&node_win);
  }
  for (MPI_Comm* c : {&progress_comm, &signal_comm, &node_comm, &comm}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  base = nullptr;
}

void release_symmetric(State& state, void* ptr) noexcept {
  if (state.finalized || state.base == nullptr) return;
  if (state.device_holds(ptr)) {
    state.release_device(static_cast<char*>(ptr) - state.device_base);
    return;
  }
  state.release(static_cast<char*>(ptr) - state.base);
}

void free_symmetric(State& state, void* ptr) {
  state.check_alive("free");
  const bool device = state.device_holds(ptr);
  const std::size_t off = device ? static_cast<std::size_t>(static_cast<char*>(ptr) - state.device_base)
                                 : state.check_range("free", ptr, 0);
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

namespace {

bool allowed(const Options& o, const char* t) {
  for (const auto& x : o.transports) {
    if (x == t) return true;
  }
  return false;
}

std::int64_t hash_text(const std::string& s) {
  return static_cast<std::int64_t>(std::hash<std::string>{}(s)&0x3fffffffffffffffULL);
}

std::int64_t topology_file_hash(const std::string& path) {
  if (path.empty()) return 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return -1;
  std::stringstream text;
  text << in.rdbuf();
  return hash_text(text.str()) | 1;  // never 0 (unset) or -1
}

// Every setting of the table marked collective must agree across ranks: a heap of a different size would give
// different offsets, a topology file on some ranks only is a broadcast the others never join, a progress thread
// is a communicator dup, the probe is a ping-pong, signal kinds would mix protocols on one word. Each rank
// agrees on a hash of each value (of the file's contents for UBEP_TOPOLOGY_FILE: unset 0, unreadable -1); the
// labels carry this rank's value, so a mismatch names the variable and what each rank holds.
void agree_settings(detail::State& s, const char* call) {
  constexpr std::size_t kPerCall = 8;  // values one collective record carries
  std::vector<std::int64_t> values;
  std::vector<std::string> labels;
  for (const Setting& row : settings()) {
    if (!row.collective) continue;
    const std::string value = row.value(s.options);
    if (std::string_view(row.name) == "UBEP_TOPOLOGY_FILE") {
      values.push_back(topology_file_hash(s.options.topology_file));
      labels.push_back("hash(UBEP_TOPOLOGY_FILE contents; -1 = unreadable)");
    } else {
      values.push_back(hash_text(value));
      labels.push_back("hash(" + std::string(row.name) + "=" + value + ")");
    }
  }
  for (std::size_t i = 0; i < values.size(); i += kPerCall) {
    const std::size_t n = std::min(kPerCall, values.size() - i);
    s.collective(call, detail::CollKind::create, std::span(values).subspan(i, n), std::span(labels).subspan(i, n));
  }
}

// A Context() that initialized MPI and then failed leaves MPI running (finalizing it is collective, and
// the caller may retry, e.g. with a smaller heap): the next Context() owns it and finalizes it.
bool mpi_left_by_failed_context = false;

void set_errors_return(State& s, MPI_Comm c) {
  UBEP_MPI_CHECK(s.rank, "Context()", MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
}

// MPI_Win_allocate_shared fails on the rank that cannot size its backing file while its node peers
// wait in the window's own collective, forever: so every rank checks first that the heaps of all ranks
// of its host fit in the directory MPI backs shared windows with (Open MPI's osc sm and MPICH: /dev/shm,
// unless OMPI_MCA_osc_sm_backing_directory moves it), and all ranks fail together if one host lacks it.
void check_shared_memory(State& s, int host_size) {
  const char* dir = std::getenv("OMPI_MCA_osc_sm_backing_directory");
  if (dir == nullptr || *dir == '\0') dir = "/dev/shm";
  const std::uint64_t need = static_cast<std::uint64_t>(host_size) * (s.heap_size + detail::kHeapAlign);
  std::uint64_t avail = ~std::uint64_t{0};
  struct statvfs fs {};
  if (::statvfs(dir, &fs) == 0) avail = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  struct {
    int fits;
    int rank;
  } mine{avail >= need ? 1 : 0, s.rank}, first{};
  UBEP_MPI_CHECK(s.rank, "Context()", MPI_Allreduce(&mine, &first, 1, MPI_2INT, MPI_MINLOC, s.comm));
  if (first.fits) return;
  std::string what = "the symmetric heaps do not fit in shared memory on the host of rank " +
                     std::to_string(first.rank) + " (every rank fails here, the heap is not allocated)";
  if (!mine.fits) {
    what += ": " + std::to_string(host_size) + " rank(s) on this host need " + std::to_string(need) + " bytes (" +
            std::to_string(s.heap_size) + "-byte UBEP_HEAP_SIZE each, plus alignment) but " + dir + " has " +
            std::to_string(avail) + " bytes free";
  }
  throw OutOfHeap(s.prefix("Context()") + what + "; lower UBEP_HEAP_SIZE or enlarge " + dir);
}

// UBEP_GPU=1 (agreed on by every rank): CUDA comes up here, and all ranks fail together when one has no usable
// GPU (a rank that threw alone would leave the others in the next collective until their timeout). A
// host-only job makes no call here.
void check_gpu(State& s) {
  if (!s.options.gpu) return;
  const GpuStatus& g = gpu_status();
  struct {
    int ok;
    int rank;
  } mine{g.available ? 1 : 0, s.rank}, first{};
  UBEP_MPI_CHECK(s.rank, "Context()", MPI_Allreduce(&mine, &first, 1, MPI_2INT, MPI_MINLOC, s.comm));
  if (first.ok) return;
  throw Error(Errc::unsupported, s.prefix("Context()") + "UBEP_GPU=1, but rank " + std::to_string(first.rank) +
                                     " has no usable GPU" + (mine.ok ? "" : " (" + g.reason + ")") +
                                     "; every rank fails here (unset UBEP_GPU for a host-only job)");
}

void build(State& s, MPI_Comm user_comm) {
  const char* call = "Context()";
  int initialized = 0, fin = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&fin);
  if (fin) throw Error(Errc::finalized, "ubep: Context(): MPI was already finalized");
  if (!initialized) {
    int provided = 0;
    UBEP_MPI_CHECK(-1, call, MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    s.owns_mpi = true;
  } else if (mpi_left_by_failed_context) {
    s.owns_mpi = true;  // MPI is ubep's: this context finalizes it
    mpi_left_by_failed_context = false;
  }
  MPI_Query_thread(&s.thread_level);
  UBEP_MPI_CHECK(-1, call, MPI_Comm_dup(user_comm, &s.comm));
  MPI_Comm_rank(s.comm, &s.rank);
  MPI_Comm_size(s.comm, &s.size);
  set_errors_return(s, s.comm);

  s.heap_size = (s.options.heap_size + 4095) & ~std::size_t{4095};  // also works around MPICH 4.0.2 (64-byte rule)
  agree_settings(s, call);
  check_gpu(s);

  const std::vector<int> vnodes = detail::parse_virtual_nodes(s.options.virtual_nodes, s.size);
  MPI_Comm shared = MPI_COMM_NULL;
  UBEP_MPI_CHECK(s.rank, call, MPI_Comm_split_type(s.comm, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &shared));
  // Which peers share this host (emulated nodes do): MPI reaches them through shared memory.
  std::vector<std::uint8_t> off_host(s.size, 1);
  int host_size = 0;
  {
    MPI_Comm_size(shared, &host_size);
    std::vector<int> host_ranks(host_size);
    UBEP_MPI_CHECK(s.rank, call, MPI_Allgather(&s.rank, 1, MPI_INT, host_ranks.data(), 1, MPI_INT, shared));
    for (int r : host_ranks) off_host[r] = 0;
  }
  if (vnodes.empty()) {
    s.node_comm = shared;
  } else {
    UBEP_MPI_CHECK(s.rank, call, MPI_Comm_split(shared, vnodes[s.rank], s.rank, &s.node_comm));
    MPI_Comm_free(&shared);
  }
  set_errors_return(s, s.node_comm);
  check_shared_memory(s, host_size);
  int node_size = 0;
  MPI_Comm_size(s.node_comm, &node_size);
  s.node_ranks.assign(node_size, 0);
  UBEP_MPI_CHECK(s.rank, call, MPI_Allgather(&s.rank, 1, MPI_INT, s.node_ranks.data(), 1, MPI_INT, s.node_comm));

  // The heap: one shared segment per node, mapped by every node peer.
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  MPI_Info_set(info, "same_disp_unit", "true");
  // MPI returns a segment that is not even 64-byte aligned (a header precedes it), so every rank
  // allocates kHeapAlign more and starts its heap at the first aligned byte; node peers learn each
  // other's padding, and the world window starts at the aligned base, so displacements stay offsets.
  char* raw = nullptr;
  const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(s.heap_size + detail::kHeapAlign), 1, info, s.node_comm,
                                         &raw, &s.node_win);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    throw OutOfHeap(s.prefix(call) + "could not allocate the " + std::to_string(s.heap_size) +
                    "-byte symmetric heap (UBEP_HEAP_SIZE) in shared memory; lower UBEP_HEAP_SIZE or enlarge /dev/shm");
  }
  UBEP_MPI_CHECK(s.rank, call, MPI_Win_set_errhandler(s.node_win, MPI_ERRORS_RETURN));
  UBEP_MPI_CHECK(s.rank, call, MPI_Win_lock_all(MPI_MODE_NOCHECK, s.node_win));
  const auto raw_addr = reinterpret_cast<std::uintptr_t>(raw);
  int pad = static_cast<int>((detail::kHeapAlign - raw_addr % detail::kHeapAlign) % detail::kHeapAlign);
  s.base = raw + pad;
  std::vector<int> pads(node_size, 0);
  UBEP_MPI_CHECK(s.rank, call, MPI_Allgather(&pad, 1, MPI_INT, pads.data(), 1, MPI_INT, s.node_comm));
  std::vector<char*> bases(s.size, nullptr);
  if (UBEP_SIMGRID) {
    // SMPI 3.32's MPI_Win_shared_query answers the start of the whole node segment for every rank (its
    // windows keep rank 0's base), while each rank's baseptr is right. Simulated ranks share one address
    // space, so node peers exchange their aligned bases as addresses.
    std::vector<std::uintptr_t> addr(node_size, 0);
    const auto mine = reinterpret_cast<std::uintptr_t>(s.base);
    UBEP_MPI_CHECK(s.rank, call, MPI_Allgather(&mine, 1, MPI_UINT64_T, addr.data(), 1, MPI_UINT64_T, s.node_comm));
    for (int i = 0; i < node_size; ++i) bases[s.node_ranks[i]] = reinterpret_cast<char*>(addr[i]);
  } else {
    for (int i = 0; i < node_size; ++i) {
      MPI_Aint sz = 0;
      int disp = 0;
      char* ptr = nullptr;
      UBEP_MPI_CHECK(s.rank, call, MPI_Win_shared_query(s.node_win, i, &sz, &disp, &ptr));
      bases[s.node_ranks[i]] = ptr + pads[i];
    }
  }

  // The route table: the cheapest allowed transport that reaches each peer.
  const std::string transports = setting("UBEP_TRANSPORTS").value(s.options);
  const bool self_ok = allowed(s.options, "self"), shm_ok = allowed(s.options, "shm"),
             mpi_ok = allowed(s.options, "mpi"), ucx_ok = allowed(s.options, "ucx");
  if (ucx_ok && !UBEP_HAVE_UCX) {
    s.fail(Errc::unsupported, call,
           "UBEP_TRANSPORTS=" + transports + " names ucx, but this build has no UCX (apt-get install libucx-dev)");
  }
  if (UBEP_SIMGRID && (shm_ok || s.options.progress_thread == ProgressThread::on)) {
    s.fail(Errc::unsupported, call,
           std::string("this is a SimGrid build, which simulates MPI only: ") +
               (shm_ok ? "UBEP_TRANSPORTS=" + transports + " names shm (use self,mpi)"
                       : std::string("UBEP_PROGRESS_THREAD=1 (a simulated rank has no threads)")));
  }
  s.routes.assign(s.size, Route::mpi);
  bool need_mpi = false, need_ucx = false;
  for (int pe = 0; pe < s.size; ++pe) {
    if (pe == s.rank && (self_ok || shm_ok)) {
      s.routes[pe] = Route::self;
    } else if (bases[pe] != nullptr && shm_ok) {
      s.routes[pe] = Route::shm;
    } else if (ucx_ok) {  // preferred over mpi off the node (one message or one put + atomic per put_signal)
      s.routes[pe] = Route::ucx;
      need_ucx = true;
    } else if (mpi_ok) {
      s.routes[pe] = Route::mpi;
      need_mpi = true;
    } else {
      s.fail(Errc::invalid_argument, call,
             "no allowed transport reaches rank " + std::to_string(pe) + " (UBEP_TRANSPORTS=" + transports +
                 " and rank " + std::to_string(pe) + " is on another node): add mpi");
    }
  }
#if UBEP_HAVE_UCX
  // Every rank must agree on whether UCX is set up (the address exchange is collective).
  int ucx_any = need_ucx ? 1 : 0;
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(MPI_IN_PLACE, &ucx_any, 1, MPI_INT, MPI_MAX, s.comm));
  if (ucx_any) {
    // A progress thread beside the caller's (UBEP_PROGRESS_THREAD=1, or the ucx route's own: auto): agreed by
    // every rank, and so is this flag, which also chooses UCX's features.
    const bool threaded = s.options.progress_thread == ProgressThread::on ||
                          (s.options.progress_thread != ProgressThread::off && !UBEP_SIMGRID);
    s.ucx = std::make_unique<detail::UcxTransport>(s.comm, s.rank, s.size, s.base, s.heap_size,
                                                   to_string(s.options.ucx_mode), s.options.wait_timeout,
                                                   s.options.poll, threaded);
  }
#endif
  // Every rank must agree on whether the world window exists (its creation is collective).
  int need_any = need_mpi ? 1 : 0;
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(MPI_IN_PLACE, &need_any, 1, MPI_INT, MPI_MAX, s.comm));
  if (need_any) {
    MPI_Info winfo;
    MPI_Info_create(&winfo);
    MPI_Info_set(winfo, "same_disp_unit", "true");
    // Both are MPI's defaults, set deliberately because the atomics contract rests on them: accumulates
    // from one origin to one word stay ordered (signals and atomics in program order), and atomicity
    // holds among accumulates of one op plus MPI_NO_OP (prepare_atomic enforces one kind per word).
    MPI_Info_set(winfo, "accumulate_ordering", "rar,raw,war,waw");
    MPI_Info_set(winfo, "accumulate_ops", "same_op_no_op");
    UBEP_MPI_CHECK(s.rank, call,
                   MPI_Win_create(s.base, static_cast<MPI_Aint>(s.heap_size), 1, winfo, s.comm, &s.world_win));
    MPI_Info_free(&winfo);
    UBEP_MPI_CHECK(s.rank, call, MPI_Win_set_errhandler(s.world_win, MPI_ERRORS_RETURN));
    UBEP_MPI_CHECK(s.rank, call, MPI_Win_lock_all(MPI_MODE_NOCHECK, s.world_win));
    // UBEP_MPI_BOUNDED=auto would run flushes to a same-host peer inline, as MPI completes them through
    // shared memory. That holds for the signals and atomics of mapped peers, not for data: osc ucx completes
    // puts into another process's MPI_Win_create window only with that process's progress, so an inline
    // flush to a stalled peer never returned. A same-host peer whose data goes through MPI
    // (UBEP_TRANSPORTS=mpi, another emulated node) is bounded like an off-host one (faults.stall.*.mpi).
    for (int pe = 0; pe < s.size; ++pe) {
      if (pe != s.rank && s.routes[pe] == Route::mpi) off_host[pe] = 1;
    }
    if (s.options.mpi_signal == MpiSignal::message) UBEP_MPI_CHECK(s.rank, call, MPI_Comm_dup(s.comm, &s.signal_comm));
    // Blocking MPI calls get the wait deadline on a worker thread, which needs MPI_THREAD_MULTIPLE (and
    // threads that call MPI, which SimGrid's simulated ranks cannot have).
    s.mpi = std::make_unique<detail::MpiRmaTransport>(
        s.world_win, s.rank, s.size, s.options.mpi_signal == MpiSignal::put,
        !UBEP_SIMGRID && s.thread_level == MPI_THREAD_MULTIPLE && s.options.mpi_bounded != MpiBounded::off,
        s.options.mpi_bounded == MpiBounded::all, std::move(off_host), s.options.wait_timeout, s.options.poll,
        s.signal_comm, s.base, s.heap_size);
  }
  s.uses_mpi = need_mpi;
  s.load_store = std::make_unique<detail::LoadStoreTransport>(bases);
  s.transport_of.resize(s.size);
  for (int pe = 0; pe < s.size; ++pe) {
    s.transport_of[pe] = s.routes[pe] == Route::mpi   ? static_cast<detail::Transport*>(s.mpi.get())
                         : s.routes[pe] == Route::ucx ? s.ucx.get()
                                                      : s.load_store.get();
  }
  s.mapped.assign(s.size, nullptr);
  for (int pe = 0; pe < s.size; ++pe) {
    if (s.routes[pe] == Route::self || s.routes[pe] == Route::shm) s.mapped[pe] = s.load_store->base(pe);
  }
  // CPU atomics and MPI accumulates are not atomic with respect to each other, so with MPI atomics and
  // signals take one path for every peer. UCX's am mode applies them with CPU atomics at the target, so
  // with UCX the peers this rank maps (self, shm) keep load/store atomics and only the ucx-route peers
  // go through UCX (in rdma mode on a hardware lane that is the NIC: docs/ROUTES.md says what then holds).
  s.atomics = need_ucx ? s.ucx.get() : need_mpi ? static_cast<detail::Transport*>(s.mpi.get()) : s.load_store.get();
  s.atomics_to.assign(s.size, s.atomics);
  if (need_ucx) {
    for (int pe = 0; pe < s.size; ++pe) {
      if (s.routes[pe] != Route::ucx) s.atomics_to[pe] = s.load_store.get();
    }
  }
  s.mapped_signals.assign(s.size, nullptr);
  for (int pe = 0; pe < s.size; ++pe) {
    if (s.atomics_to[pe] == s.load_store.get()) s.mapped_signals[pe] = s.mapped[pe];
  }
  s.heap = detail::HeapAllocator(0, s.heap_size);

  s.topology = detail::gather_topology(s.comm, s.options, vnodes);
  s.node_id = s.topology.node_of(s.rank);

  if (s.options.progress_thread == ProgressThread::on) {
    if (s.thread_level != MPI_THREAD_MULTIPLE) {
      s.fail(Errc::unsupported, call,
             "UBEP_PROGRESS_THREAD=1 needs MPI_THREAD_MULTIPLE (MPI was initialized with a lower level)");
    }
    UBEP_MPI_CHECK(s.rank, call, MPI_Comm_dup(s.comm, &s.progress_comm));
    const auto interval = std::chrono::microseconds(s.options.progress_interval_us);
    s.progress_thread = std::thread([&s, interval] {
      while (!s.progress_stop.load(std::memory_order_relaxed)) {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, s.progress_comm, &flag, MPI_STATUS_IGNORE);
        if (s.ucx) s.ucx->poll_keeping_errors();  // messages aimed at this rank land while it computes
        s.thread_progress_staged();               // staged GPU chunks land, credits and get replies go out
        std::this_thread::sleep_for(interval);
      }
    });
    s.progress_kind = "full: MPI, UCX and the staged GPU route every " +
                      std::to_string(s.options.progress_interval_us) + " us (UBEP_PROGRESS_THREAD=1)";
  }
#if UBEP_HAVE_UCX
  else if (s.ucx && s.options.progress_thread != ProgressThread::off) {
    // The ucx route's thread: asleep on the worker's event fd until a message arrives for this rank, then it
    // runs the handlers and sends the answers (and moves the staged GPU route on), so peers' quiet(), gets and
    // atomics complete while this rank computes or sits in a plain MPI call. It calls no MPI.
    s.progress_wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s.progress_wake_fd < 0) {
      s.fail(Errc::internal, call, std::string("eventfd for the progress thread: ") + std::strerror(errno));
    }
    auto* u = static_cast<detail::UcxTransport*>(s.ucx.get());
    s.progress_thread = std::thread([&s, u] {
      // While the application progresses the worker itself (it waits, tests, polls in ubep), the thread keeps away:
      // waking on every message and taking the worker's lock from a spinning waiter doubled the one-way latency
      // across two emulated nodes, and even a look every 200 us cost 40 % there (2 cores). So it looks after kMinUs,
      // then after twice as long each time the application was still there, up to kMaxUs. Once the application has
      // not progressed for one such interval, the thread serves the worker until the application is back: first by
      // polling it (every kPollUs, doubling to kMaxPollUs), and after kArmUs away asleep on the worker's event fd
      // (ucp_worker_arm), so an idle job burns no core. Arming is kept for long absences because every ping-pong
      // after an arm ran 1.3-1.9x slower across two emulated nodes (UCX 1.13, TCP).
      constexpr long kMinUs = 200, kMaxUs = 10000, kPollUs = 50, kMaxPollUs = 2000, kArmUs = 1000000;
      pollfd stop_fd{s.progress_wake_fd, POLLIN, 0};
      pollfd fds[2] = {{u->event_fd(), POLLIN, 0}, stop_fd};
      const auto nap = [&](long us) {
        timespec t{us / 1000000, (us % 1000000) * 1000};
        (void)::ppoll(&stop_fd, 1, &t, nullptr);
      };
      long away_us = kMinUs;
      while (!s.progress_stop.load(std::memory_order_relaxed)) {
        const std::uint64_t seen = u->app_polls();
        nap(away_us);
        if (u->app_polls() != seen) {  // the application is in ubep
          away_us = std::min(away_us * 2, kMaxUs);
          continue;
        }
        away_us = kMinUs;
        long poll_us = kPollUs, served_us = 0;
        while (!s.progress_stop.load(std::memory_order_relaxed) && u->app_polls() == seen) {
          u->thread_pass();
          s.thread_progress_staged();
          if (served_us < kArmUs) {
            nap(poll_us);
            served_us += poll_us;
            poll_us = std::min(poll_us * 2, kMaxPollUs);
            continue;
          }
          if (!u->arm()) continue;  // something arrived during the pass: another pass first
          // Local work in flight (a rendezvous, sends): look again soon even if no event says so.
          (void)::poll(fds, 2, u->busy() ? 1 : 1000);
        }
      }
    });
    s.progress_kind =
        "ucx: serves the UCX worker while the application is away from ubep (polls it, then sleeps on its event fd; "
        "UBEP_PROGRESS_THREAD=auto)";
  }
#endif
}

}  // namespace

Context::Context(MPI_Comm comm, Options options) : state_(std::make_shared<State>()) {
  state_->options = std::move(options);
  try {
    build(*state_, comm);
  } catch (...) {
    state_->teardown();
    if (state_->owns_mpi) mpi_left_by_failed_context = true;
    state_->finalized = true;
    throw;
  }
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
      state_->rank, "~Context",
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
  if (s.owns_mpi) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
}

bool Context::finalized() const noexcept { return !state_ || state_->finalized; }
int Context::rank() const { return state_->rank; }
int Context::size() const { return state_->size; }
MPI_Comm Context::comm() const {
  state_->check_alive("comm");
  return state_->comm;
}
const Options& Context::options() const { return state_->options; }
Route Context::route(int pe) const {
  state_->check_pe("route", pe);
  return state_->routes[pe];
}
bool Context::atomics_through_mpi() const { return state_->mpi && state_->atomics == state_->mpi.get(); }
int Context::node() const { return state_->node_id; }
std::span<const int> Context::node_ranks() const { return state_->node_ranks; }
const Topology& Context::topology() const { return state_->topology; }
int Context::thread_level() const { return state_->thread_level; }
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
  out.node_window_model = memory_model(s.node_win);
  out.world_window_model = memory_model(s.world_win);
  out.routes = s.routes;
  if (s.ucx) {
    out.ucx = s.ucx->describe();
    out.ucx_peers.resize(s.size);
    for (int pe = 0; pe < s.size; ++pe) out.ucx_peers[pe] = s.ucx->describe_peer(pe);
  }
  for (Route r : {Route::self, Route::shm, Route::ucx, Route::mpi}) {
    const bool used = std::find(s.routes.begin(), s.routes.end(), r) != s.routes.end() ||
                      (r == Route::mpi && s.mpi && s.atomics == s.mpi.get()) ||
                      (r == Route::ucx && s.ucx && s.atomics == s.ucx.get());
    if (used) out.transports.emplace_back(to_string(r));
  }
  out.progress_thread = s.progress_kind;
  out.gpu_heap = detail::gpu_heap_description(s);
  for (int pe = 0; pe < s.size; ++pe) out.gpu_peers.push_back(detail::gpu_path(s, pe));
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
      detail::alloc_agreed(s, "alloc", detail::CollKind::alloc, s.heap, bytes, align);
  // Signal messages (UBEP_MPI_SIGNAL=message) land when applied here, not at the sender's quiet(): the
  // ones sent before the collective are applied now, so none changes a word of the new object later.
  s.apply_sent_signal_messages("alloc");
  if (bytes == 0) return nullptr;
  if (!off) detail::throw_out_of_heap(s, "alloc", s.heap, s.heap_size, "UBEP_HEAP_SIZE", bytes, align);
  return s.base + *off;
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

std::size_t Context::heap_free() const { return state_->heap.largest_free(); }

void Context::put(void* dest, const void* src, std::size_t bytes, int pe) {
  State& s = *state_;
  s.check_alive("put");
  s.check_pe("put", pe);
  if (bytes == 0) return;
  if (s.device_holds(dest)) return s.device_put("put", dest, src, bytes, pe, true);
  const std::size_t off = s.check_range("put", dest, bytes);
  if (char* m = s.mapped[pe]) {
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
  if (const char* m = s.mapped[pe]) {
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
  if (char* m = s.mapped[pe]) {
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
  if (const char* m = s.mapped[pe]) {
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
  return s.mapped[pe] ? s.mapped[pe] + off : nullptr;
}

void Context::fence() {
  State& s = *state_;
  s.check_alive("fence");
  // Deferred signals were issued before the fence in program order: they go out now, so nothing issued
  // after the fence (a put that overwrites their data) can overtake them.
  s.flush_pending_signals();
  s.complete_device("fence");
  s.load_store->fence();
  if (s.ucx) s.ucx->fence();
  if (s.mpi) s.mpi->fence();
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
  if (s.routes[pe] == Route::ucx) {
    s.complete_device("flush_local");
    s.ucx->flush_local(pe);
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
  s.load_store->flush_all();
  if (s.ucx) s.ucx->flush(pe);
  if (s.mpi) s.mpi->flush(pe);
  // This rank's atomics to pe are complete: a later one of another kind on the same word cannot overlap them.
  if (!s.atomic_family.empty()) {
    std::erase_if(s.atomic_family, [&](const auto& kv) {
      return kv.first % static_cast<std::uint64_t>(s.size) == static_cast<std::uint64_t>(pe);
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
