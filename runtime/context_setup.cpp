// Context(): the phases that set up a Context, in the order the constructor runs them (MPI, the agreed
// settings, the node, the host heap, the route table and its transports, the topology, the progress thread).
// When a phase throws, the constructor tears down what the phases before it built (State::teardown).
#include <sys/statvfs.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "base/mpi_check.hpp"
#include "runtime/device_memory.hpp"  // State's parts, complete where make_shared<State> needs them
#include "runtime/gpu_streams.hpp"
#include "runtime/state.hpp"
#include "topology/discover.hpp"
#include "ubep/config.hpp"
#include "ubep/context.hpp"
#include "ubep/gpu.hpp"
#if UBEP_HAVE_UCX
#include "transports/ucx/ucx_transport.hpp"
#endif

namespace ubep {

using detail::State;

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

// A Context() that initialized MPI and then failed leaves MPI running (finalizing it is collective, and
// the caller may retry, e.g. with a smaller heap): the next Context() owns it and finalizes it.
bool mpi_left_by_failed_context = false;

void set_errors_return(State& s, MPI_Comm c) {
  UBEP_MPI_CHECK(s.comms.rank, "Context()", MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
}

// MPI_Win_allocate_shared fails on the rank that cannot size its backing file while its node peers
// wait in the window's own collective, forever: so every rank checks first that the heaps of all ranks
// of its host fit in the directory MPI backs shared windows with (Open MPI's osc sm and MPICH: /dev/shm,
// unless OMPI_MCA_osc_sm_backing_directory moves it), and all ranks fail together if one host lacks it.
void check_shared_memory(State& s, int host_size) {
  const char* dir = std::getenv("OMPI_MCA_osc_sm_backing_directory");
  if (dir == nullptr || *dir == '\0') dir = "/dev/shm";
  const std::uint64_t need = static_cast<std::uint64_t>(host_size) * (s.heap.size + detail::kHeapAlign);
  std::uint64_t avail = ~std::uint64_t{0};
  struct statvfs fs {};
  if (::statvfs(dir, &fs) == 0) avail = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  struct {
    int fits;
    int rank;
  } mine{avail >= need ? 1 : 0, s.comms.rank}, first{};
  UBEP_MPI_CHECK(s.comms.rank, "Context()", MPI_Allreduce(&mine, &first, 1, MPI_2INT, MPI_MINLOC, s.comms.comm));
  if (first.fits) return;
  std::string what = "the symmetric heaps do not fit in shared memory on the host of rank " +
                     std::to_string(first.rank) + " (every rank fails here, the heap is not allocated)";
  if (!mine.fits) {
    what += ": " + std::to_string(host_size) + " rank(s) on this host need " + std::to_string(need) + " bytes (" +
            std::to_string(s.heap.size) + "-byte UBEP_HEAP_SIZE each, plus alignment) but " + dir + " has " +
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
  } mine{g.available ? 1 : 0, s.comms.rank}, first{};
  UBEP_MPI_CHECK(s.comms.rank, "Context()", MPI_Allreduce(&mine, &first, 1, MPI_2INT, MPI_MINLOC, s.comms.comm));
  if (first.ok) return;
  throw Error(Errc::unsupported, s.prefix("Context()") + "UBEP_GPU=1, but rank " + std::to_string(first.rank) +
                                     " has no usable GPU" + (mine.ok ? "" : " (" + g.reason + ")") +
                                     "; every rank fails here (unset UBEP_GPU for a host-only job)");
}

// Context(), phase 1: MPI up (initialized here when the caller has not), the communicator duplicated.
void init_mpi(State& s, const char* call, MPI_Comm user_comm) {
  int initialized = 0, fin = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&fin);
  if (fin) throw Error(Errc::finalized, "ubep: Context(): MPI was already finalized");
  if (!initialized) {
    int provided = 0;
    UBEP_MPI_CHECK(-1, call, MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    s.comms.owns_mpi = true;
  } else if (mpi_left_by_failed_context) {
    s.comms.owns_mpi = true;  // MPI is ubep's: this context finalizes it
    mpi_left_by_failed_context = false;
  }
  MPI_Query_thread(&s.comms.thread_level);
  UBEP_MPI_CHECK(-1, call, MPI_Comm_dup(user_comm, &s.comms.comm));
  MPI_Comm_rank(s.comms.comm, &s.comms.rank);
  MPI_Comm_size(s.comms.comm, &s.comms.size);
  set_errors_return(s, s.comms.comm);
}

// Phase 2: every setting of the table marked collective agrees across ranks: a heap of a different size would
// give different offsets, a topology file on some ranks only is a broadcast the others never join, a progress
// thread is a communicator dup, the probe is a ping-pong, signal kinds would mix protocols on one word. Each
// rank agrees on a hash of each value (of the file's contents for UBEP_TOPOLOGY_FILE: unset 0, unreadable -1);
// the labels carry this rank's value, so a mismatch names the variable and what each rank holds.
void agree_settings(State& s, const char* call) {
  s.heap.size = (s.options.heap_size + 4095) & ~std::size_t{4095};  // also works around MPICH 4.0.2 (64-byte rule)
  constexpr std::size_t kPerCall = 8;                               // values one collective record carries
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

// The transports UBEP_TRANSPORTS names, as the messages show them.
std::string transports_list(const Options& o) { return setting("UBEP_TRANSPORTS").value(o); }

// Phase 4: the node communicator and the node's ranks; returns which peers are off this host.
std::vector<std::uint8_t> split_node(State& s, const char* call, const std::vector<int>& vnodes) {
  MPI_Comm shared = MPI_COMM_NULL;
  UBEP_MPI_CHECK(s.comms.rank, call,
                 MPI_Comm_split_type(s.comms.comm, MPI_COMM_TYPE_SHARED, s.comms.rank, MPI_INFO_NULL, &shared));
  // Which peers share this host (emulated nodes do): MPI reaches them through shared memory.
  std::vector<std::uint8_t> off_host(s.comms.size, 1);
  int host_size = 0;
  {
    MPI_Comm_size(shared, &host_size);
    std::vector<int> host_ranks(host_size);
    UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allgather(&s.comms.rank, 1, MPI_INT, host_ranks.data(), 1, MPI_INT, shared));
    for (int r : host_ranks) off_host[r] = 0;
  }
  if (vnodes.empty()) {
    s.comms.node_comm = shared;
  } else {
    UBEP_MPI_CHECK(s.comms.rank, call, MPI_Comm_split(shared, vnodes[s.comms.rank], s.comms.rank, &s.comms.node_comm));
    MPI_Comm_free(&shared);
  }
  set_errors_return(s, s.comms.node_comm);
  check_shared_memory(s, host_size);
  int node_size = 0;
  MPI_Comm_size(s.comms.node_comm, &node_size);
  s.comms.node_ranks.assign(node_size, 0);
  UBEP_MPI_CHECK(s.comms.rank, call,
                 MPI_Allgather(&s.comms.rank, 1, MPI_INT, s.comms.node_ranks.data(), 1, MPI_INT, s.comms.node_comm));
  return off_host;
}

// Phase 5: the symmetric host heap and its node window; returns each node peer's heap as mapped here.
std::vector<char*> create_heap(State& s, const char* call) {
  const int node_size = static_cast<int>(s.comms.node_ranks.size());
  // The heap: one shared segment per node, mapped by every node peer.
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  MPI_Info_set(info, "same_disp_unit", "true");
  // MPI returns a segment that is not even 64-byte aligned (a header precedes it), so every rank
  // allocates kHeapAlign more and starts its heap at the first aligned byte; node peers learn each
  // other's padding, and the world window starts at the aligned base, so displacements stay offsets.
  char* raw = nullptr;
  const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(s.heap.size + detail::kHeapAlign), 1, info,
                                         s.comms.node_comm, &raw, &s.heap.node_win);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    throw OutOfHeap(s.prefix(call) + "could not allocate the " + std::to_string(s.heap.size) +
                    "-byte symmetric heap (UBEP_HEAP_SIZE) in shared memory; lower UBEP_HEAP_SIZE or enlarge /dev/shm");
  }
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_set_errhandler(s.heap.node_win, MPI_ERRORS_RETURN));
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_lock_all(MPI_MODE_NOCHECK, s.heap.node_win));
  const auto raw_addr = reinterpret_cast<std::uintptr_t>(raw);
  int pad = static_cast<int>((detail::kHeapAlign - raw_addr % detail::kHeapAlign) % detail::kHeapAlign);
  s.heap.base = raw + pad;
  std::vector<int> pads(node_size, 0);
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allgather(&pad, 1, MPI_INT, pads.data(), 1, MPI_INT, s.comms.node_comm));
  std::vector<char*> bases(s.comms.size, nullptr);
  if (UBEP_SIMGRID) {
    // SMPI 3.32's MPI_Win_shared_query answers the start of the whole node segment for every rank (its
    // windows keep rank 0's base), while each rank's baseptr is right. Simulated ranks share one address
    // space, so node peers exchange their aligned bases as addresses.
    std::vector<std::uintptr_t> addr(node_size, 0);
    const auto mine = reinterpret_cast<std::uintptr_t>(s.heap.base);
    UBEP_MPI_CHECK(s.comms.rank, call,
                   MPI_Allgather(&mine, 1, MPI_UINT64_T, addr.data(), 1, MPI_UINT64_T, s.comms.node_comm));
    for (int i = 0; i < node_size; ++i) bases[s.comms.node_ranks[i]] = reinterpret_cast<char*>(addr[i]);
  } else {
    for (int i = 0; i < node_size; ++i) {
      MPI_Aint sz = 0;
      int disp = 0;
      char* ptr = nullptr;
      UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_shared_query(s.heap.node_win, i, &sz, &disp, &ptr));
      bases[s.comms.node_ranks[i]] = ptr + pads[i];
    }
  }
  s.heap.alloc = detail::HeapAllocator(0, s.heap.size);
  return bases;
}

// Which transports the route table needs beyond load/store.
struct RouteNeeds {
  bool mpi = false, ucx = false;
};

// Phase 6: the route table, from the peers' heaps mapped here (`bases`) and UBEP_TRANSPORTS.
RouteNeeds build_routes(State& s, const char* call, const std::vector<char*>& bases) {
  const std::string transports = transports_list(s.options);
  // The route table: the cheapest allowed transport that reaches each peer.
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
  s.routes.route.assign(s.comms.size, Route::mpi);
  bool need_mpi = false, need_ucx = false;
  for (int pe = 0; pe < s.comms.size; ++pe) {
    if (pe == s.comms.rank && (self_ok || shm_ok)) {
      s.routes.route[pe] = Route::self;
    } else if (bases[pe] != nullptr && shm_ok) {
      s.routes.route[pe] = Route::shm;
    } else if (ucx_ok) {  // preferred over mpi off the node (one message or one put + atomic per put_signal)
      s.routes.route[pe] = Route::ucx;
      need_ucx = true;
    } else if (mpi_ok) {
      s.routes.route[pe] = Route::mpi;
      need_mpi = true;
    } else {
      s.fail(Errc::invalid_argument, call,
             "no allowed transport reaches rank " + std::to_string(pe) + " (UBEP_TRANSPORTS=" + transports +
                 " and rank " + std::to_string(pe) + " is on another node): add mpi");
    }
  }
  return {need_mpi, need_ucx};
}

// Phase 7: the ucx transport, where some rank needs it.
void start_ucx([[maybe_unused]] State& s, [[maybe_unused]] const char* call, [[maybe_unused]] bool need_ucx) {
#if UBEP_HAVE_UCX
  // Every rank must agree on whether UCX is set up (the address exchange is collective).
  int ucx_any = need_ucx ? 1 : 0;
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allreduce(MPI_IN_PLACE, &ucx_any, 1, MPI_INT, MPI_MAX, s.comms.comm));
  if (ucx_any) {
    // A progress thread beside the caller's (UBEP_PROGRESS_THREAD=1, or the ucx route's own: auto): agreed by
    // every rank, and so is this flag, which also chooses UCX's features.
    const bool threaded = s.options.progress_thread == ProgressThread::on ||
                          (s.options.progress_thread == ProgressThread::automatic && !UBEP_SIMGRID);
    s.routes.ucx = std::make_unique<detail::UcxTransport>(
        s.comms.comm, s.comms.rank, s.comms.size, s.heap.base, s.heap.size, to_string(s.options.ucx_mode),
        s.options.wait_timeout, s.options.poll, threaded, s.options.ucx_eager_max);
  }
#endif
}

// Phase 8: the world window and the mpi transport on it, where some rank needs them.
void open_world_window(State& s, const char* call, bool need_mpi, std::vector<std::uint8_t> off_host) {
  // Every rank must agree on whether the world window exists (its creation is collective).
  int need_any = need_mpi ? 1 : 0;
  UBEP_MPI_CHECK(s.comms.rank, call, MPI_Allreduce(MPI_IN_PLACE, &need_any, 1, MPI_INT, MPI_MAX, s.comms.comm));
  if (need_any) {
    MPI_Info winfo;
    MPI_Info_create(&winfo);
    MPI_Info_set(winfo, "same_disp_unit", "true");
    // Both are MPI's defaults, set deliberately because the atomics contract rests on them: accumulates
    // from one origin to one word stay ordered (signals and atomics in program order), and atomicity
    // holds among accumulates of one op plus MPI_NO_OP (prepare_atomic enforces one kind per word).
    MPI_Info_set(winfo, "accumulate_ordering", "rar,raw,war,waw");
    MPI_Info_set(winfo, "accumulate_ops", "same_op_no_op");
    UBEP_MPI_CHECK(
        s.comms.rank, call,
        MPI_Win_create(s.heap.base, static_cast<MPI_Aint>(s.heap.size), 1, winfo, s.comms.comm, &s.heap.world_win));
    MPI_Info_free(&winfo);
    UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_set_errhandler(s.heap.world_win, MPI_ERRORS_RETURN));
    UBEP_MPI_CHECK(s.comms.rank, call, MPI_Win_lock_all(MPI_MODE_NOCHECK, s.heap.world_win));
    // UBEP_MPI_BOUNDED=auto would run flushes to a same-host peer inline, as MPI completes them through
    // shared memory. That holds for the signals and atomics of mapped peers, not for data: osc ucx completes
    // puts into another process's MPI_Win_create window only with that process's progress, so an inline
    // flush to a stalled peer never returned. A same-host peer whose data goes through MPI
    // (UBEP_TRANSPORTS=mpi, another emulated node) is bounded like an off-host one (faults.stall.*.mpi).
    for (int pe = 0; pe < s.comms.size; ++pe) {
      if (pe != s.comms.rank && s.routes.route[pe] == Route::mpi) off_host[pe] = 1;
    }
    if (s.options.mpi_signal == MpiSignal::message)
      UBEP_MPI_CHECK(s.comms.rank, call, MPI_Comm_dup(s.comms.comm, &s.comms.signal_comm));
    // Blocking MPI calls get the wait deadline on a worker thread, which needs MPI_THREAD_MULTIPLE (and
    // threads that call MPI, which SimGrid's simulated ranks cannot have).
    s.routes.mpi = std::make_unique<detail::MpiRmaTransport>(
        s.heap.world_win, s.comms.rank, s.comms.size, s.options.mpi_signal == MpiSignal::put,
        !UBEP_SIMGRID && s.comms.thread_level == MPI_THREAD_MULTIPLE && s.options.mpi_bounded != MpiBounded::off,
        s.options.mpi_bounded == MpiBounded::all, std::move(off_host), s.options.wait_timeout, s.options.poll,
        s.comms.signal_comm, s.heap.base, s.heap.size);
  }
}

// Phase 9: per peer, the transports of data, atomics and signals, and the mappings of the fast paths.
void compose_transports(State& s, const std::vector<char*>& bases, RouteNeeds need) {
  const bool need_mpi = need.mpi, need_ucx = need.ucx;
  s.routes.uses_mpi = need_mpi;
  s.routes.load_store = std::make_unique<detail::LoadStoreTransport>(bases);
  s.routes.transport_of.resize(s.comms.size);
  for (int pe = 0; pe < s.comms.size; ++pe) {
    s.routes.transport_of[pe] = s.routes.route[pe] == Route::mpi   ? static_cast<detail::Transport*>(s.routes.mpi.get())
                                : s.routes.route[pe] == Route::ucx ? s.routes.ucx.get()
                                                                   : s.routes.load_store.get();
  }
  s.routes.mapped.assign(s.comms.size, nullptr);
  for (int pe = 0; pe < s.comms.size; ++pe) {
    if (s.routes.route[pe] == Route::self || s.routes.route[pe] == Route::shm)
      s.routes.mapped[pe] = s.routes.load_store->base(pe);
  }
  // CPU atomics and MPI accumulates are not atomic with respect to each other, so with MPI atomics and
  // signals take one path for every peer. UCX's am mode applies them with CPU atomics at the target, so
  // with UCX the peers this rank maps (self, shm) keep load/store atomics and only the ucx-route peers
  // go through UCX (in rdma mode on a hardware lane that is the NIC: docs/ROUTES.md says what then holds).
  s.routes.atomics = need_ucx   ? s.routes.ucx.get()
                     : need_mpi ? static_cast<detail::Transport*>(s.routes.mpi.get())
                                : s.routes.load_store.get();
  s.routes.atomics_to.assign(s.comms.size, s.routes.atomics);
  if (need_ucx) {
    for (int pe = 0; pe < s.comms.size; ++pe) {
      if (s.routes.route[pe] != Route::ucx) s.routes.atomics_to[pe] = s.routes.load_store.get();
    }
  }
  s.routes.mapped_signals.assign(s.comms.size, nullptr);
  for (int pe = 0; pe < s.comms.size; ++pe) {
    if (s.routes.atomics_to[pe] == s.routes.load_store.get()) s.routes.mapped_signals[pe] = s.routes.mapped[pe];
  }
}

// Phase 10: the topology every rank agrees on.
void learn_topology(State& s, const std::vector<int>& vnodes) {
  s.topology = detail::gather_topology(s.comms.comm, s.options, vnodes);
  s.comms.node_id = s.topology.node_of(s.comms.rank);
}

}  // namespace

Context::Context(MPI_Comm comm, Options options) : state_(std::make_shared<State>()) {
  state_->options = std::move(options);
  State& s = *state_;
  const char* call = "Context()";
  try {
    init_mpi(s, call, comm);
    agree_settings(s, call);
    check_gpu(s);
    const std::vector<int> vnodes = detail::parse_virtual_nodes(s.options.virtual_nodes, s.comms.size);
    std::vector<std::uint8_t> off_host = split_node(s, call, vnodes);
    const std::vector<char*> bases = create_heap(s, call);
    const RouteNeeds need = build_routes(s, call, bases);
    start_ucx(s, call, need.ucx);
    open_world_window(s, call, need.mpi, std::move(off_host));
    compose_transports(s, bases, need);
    learn_topology(s, vnodes);
    start_progress(s, call);
  } catch (...) {
    state_->teardown();
    if (state_->comms.owns_mpi) mpi_left_by_failed_context = true;
    state_->finalized = true;
    throw;
  }
}

}  // namespace ubep
