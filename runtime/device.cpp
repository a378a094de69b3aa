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

// ---- the staged route: GPU-heap data to peers on other nodes ------------------------------------------------
//
// transports/staging.hpp's protocol over this rank's copy stream and its host routes. Buffers in the host heap
// (one region, allocated collectively with the GPU heap when the job spans nodes), per rank r of the job and
// slot k (kSlots per pair), each slot a 64-byte header followed by one chunk:
//   inbox[r][k]   chunks from origin r          outbox[r][k]  chunks to target r, copied out of the device
//   arrived[r][k] count of chunks origin r put into inbox[r][k] (its signal word; put_signal, add 1)
//   credit[r][k]  count of chunks target r drained from its inbox slot k (target r's signal_op, add 1)
//   request[r][j] get requests from rank r (kRequests per pair, a ring)
//   requested[r]  count of get requests rank r put into request[r] (its signal word; put_signal, add 1)
// The origin's put returns when every chunk has landed in the target's GPU heap (every credit back) or, for
// put_nbi, at once, completing at quiet()/flush(); the target drains its inbox when it calls into ubep (waits,
// test*, progress(), quiet(), collectives), so a target that computes holds its origin's chunks back.
// A get is the same protocol the other way: the requester puts a request (source offset in the server's GPU
// heap, bytes, destination address in the requester's memory, sequence number) into the server's ring; the
// server, when it calls into ubep, queues a transfer from its GPU heap to that address, its header's `dest`
// marked kAbsolute (an address of the target's, not an offset in its GPU heap) and its `signal` the sequence
// number; the get completes when that transfer has landed. At most kRequests gets per pair are outstanding: a
// reply landed means the server has read its request, so the ring entry is free again.

namespace {

constexpr int kSlots = 2;
constexpr std::size_t kHeader = 64;
static_assert(sizeof(staging::ChunkHeader) <= kHeader);
constexpr int kRequests = 4;
using staging::GetRequest;
using staging::kAbsolute;
constexpr std::size_t kRequestBytes = 32;
static_assert(sizeof(GetRequest) == kRequestBytes);

}  // namespace

struct StagedRoute {
  /// The copy engine of both sides: the heap's copies, done when the copy stream has passed them. On the
  /// target side a "device address" is an offset in this rank's GPU heap (what the origin can name).
  struct Engine final : staging::CopyEngine {
    State& s;
    char* device_base;  // null on the origin side: addresses are pointers already
    Ticket next = 0;
    Engine(State& state, char* base) : s(state), device_base(base) {}
    Ticket to_host(void* host, const void* device, std::size_t bytes) override {
      s.device->heap->copy_async(host, device, bytes, s.prefix("GPU staging"));
      return ++next;
    }
    Ticket to_device(void* device, const void* host, std::size_t bytes) override {
      const auto addr = reinterpret_cast<std::uintptr_t>(device);
      char* to = (addr & kAbsolute) ? reinterpret_cast<char*>(addr & ~kAbsolute) : device_base + addr;
      s.device->heap->copy_async(to, host, bytes, s.prefix("GPU staging"));
      return ++next;
    }
    bool done(Ticket) override {
      s.device->heap->synchronize(s.prefix("GPU staging"));
      return true;
    }
  };
  /// The origin's wire to target pe: a chunk and its header in one put_signal into pe's inbox slot.
  struct PeerWire final : staging::Wire {
    StagedRoute& r;
    int pe;
    std::vector<std::uint64_t> credits_seen = std::vector<std::uint64_t>(kSlots, 0);
    PeerWire(StagedRoute& route, int target) : r(route), pe(target) {}
    void send(int slot, const void* src, const staging::ChunkHeader& h) override {
      auto* data = static_cast<char*>(const_cast<void*>(src));
      std::memcpy(data - kHeader, &h, sizeof h);
      // put_signal_nbi: the slot is not written again before its credit, which the target returns after the data
      r.s.put_signal_checked(r.inbox(r.s.rank, slot), data - kHeader, kHeader + h.bytes, r.arrived(r.s.rank, slot), 1,
                             SignalOp::add, pe, false);
    }
    std::vector<int> credits() override {
      std::vector<int> out;
      for (int k = 0; k < kSlots; ++k) {
        const std::uint64_t v = r.word(r.credit(pe, k));
        // A slot holds one chunk: its credit count moves by one at most between two steps (the peer's word: a
        // forged count must not make this loop run for ever).
        if (v < credits_seen[k] || v - credits_seen[k] > 1) {
          throw Error(Errc::protocol, r.s.prefix("GPU staging") + "the credit count of slot " + std::to_string(k) +
                                          " from rank " + std::to_string(pe) + " went from " +
                                          std::to_string(credits_seen[k]) + " to " + std::to_string(v));
        }
        for (; credits_seen[k] < v; ++credits_seen[k]) out.push_back(k);
      }
      return out;
    }
  };
  struct Peer {
    std::unique_ptr<PeerWire> wire;
    std::unique_ptr<staging::Origin> origin;
    std::unique_ptr<staging::Target> target;
    std::vector<std::uint64_t> arrived_seen = std::vector<std::uint64_t>(kSlots, 0);
    std::uint64_t gets_sent = 0, gets_landed = 0;  // this rank's gets from the peer
    std::deque<GetRequest> gets_out;               // ... those awaiting their data: where each may land
    std::uint64_t requests_seen = 0;               // the peer's gets served by this rank
    std::string broken;                            // the protocol violation that isolated the peer, if any
  };

  State& s;
  std::size_t region = 0, chunk = 0, slot_bytes = 0, n = 0;
  // The caller's thread and, when `threaded`, the progress thread share everything below (the mutex); the
  // thread keeps its error for the caller's thread.
  std::mutex mu;
  bool threaded = false;
  std::exception_ptr thread_error;
  Engine origin_engine, target_engine;
  std::vector<Peer> peers;  // per world rank; empty members for the ranks of this node

  StagedRoute(State& state, std::size_t region_offset, std::size_t chunk_bytes)
      : s(state),
        region(region_offset),
        chunk(chunk_bytes),
        slot_bytes(kHeader + chunk_bytes),
        n(static_cast<std::size_t>(state.size)),
        origin_engine(state, nullptr),
        target_engine(state, state.device_base),
        peers(n) {
    const staging::Config config{chunk, kSlots};
    for (int pe = 0; pe < s.size; ++pe) {
      if (s.device->peer[pe] != nullptr) continue;  // this node: CUDA IPC
      Peer& p = peers[pe];
      std::vector<void*> out_slots, in_slots;
      for (int k = 0; k < kSlots; ++k) {
        out_slots.push_back(s.base + outbox(pe, k) + kHeader);
        in_slots.push_back(s.base + inbox(pe, k) + kHeader);
      }
      p.wire = std::make_unique<PeerWire>(*this, pe);
      p.origin = std::make_unique<staging::Origin>(config, origin_engine, *p.wire, std::move(out_slots));
      p.target = std::make_unique<staging::Target>(
          config, target_engine, std::move(in_slots),
          [this, pe](int k) { s.signal_checked(credit(s.rank, k), 1, SignalOp::add, pe, false); },
          [this, pe](const staging::ChunkHeader& h) {  // put_signal sends its signal after the transfer; a get
            if (h.signal == 0) return;                 // reply completes its get (in order)
            Peer& q = peers[pe];
            q.gets_landed = h.signal;
            while (!q.gets_out.empty() && q.gets_out.front().seq <= h.signal) q.gets_out.pop_front();
          });
      // The chunk headers are the peer's: a transfer lands only where this rank let it (check_dest).
      p.target->set_dest_check([this, pe](const staging::ChunkHeader& h) { return check_dest(pe, h); });
    }
  }
  /// Where a transfer from pe may land: a put in this rank's GPU heap (no signal), a get's reply exactly where one of
  /// this rank's gets from pe asked for it.
  std::string check_dest(int pe, const staging::ChunkHeader& h) const {
    if (h.dest & kAbsolute) {
      for (const GetRequest& q : peers[pe].gets_out) {
        if (q.seq != h.signal) continue;
        if ((h.dest & ~kAbsolute) != q.dest || h.total != q.bytes) {
          return "field 'dest': get " + std::to_string(q.seq) + " asked for " + std::to_string(q.bytes) +
                 " bytes elsewhere";
        }
        return {};
      }
      return "field 'signal' = " + std::to_string(h.signal) + ": no get of this rank from rank " + std::to_string(pe) +
             " awaits that reply";
    }
    if (h.signal != 0) return "field 'signal' = " + std::to_string(h.signal) + ": a put carries none";
    if (h.dest > s.device_size || h.total > s.device_size - h.dest) {
      return "field 'dest' = " + std::to_string(h.dest) + ": [dest, +" + std::to_string(h.total) +
             " bytes) is outside the " + std::to_string(s.device_size) + "-byte GPU heap";
    }
    return {};
  }
  static std::size_t region_bytes(std::size_t ranks, std::size_t chunk_bytes) {
    return ranks * (kSlots * (2 * (kHeader + chunk_bytes) + 2 * sizeof(std::uint64_t)) + kRequests * kRequestBytes +
                    sizeof(std::uint64_t));
  }
  std::size_t inbox(int r, int k) const { return region + (static_cast<std::size_t>(r) * kSlots + k) * slot_bytes; }
  std::size_t outbox(int r, int k) const { return inbox(r, k) + n * kSlots * slot_bytes; }
  std::size_t arrived(int r, int k) const {
    return region + 2 * n * kSlots * slot_bytes + (static_cast<std::size_t>(r) * kSlots + k) * 8;
  }
  std::size_t credit(int r, int k) const { return arrived(r, k) + n * kSlots * 8; }
  std::size_t request(int r, int j) const {
    return credit(0, 0) + n * kSlots * 8 + (static_cast<std::size_t>(r) * kRequests + j) * kRequestBytes;
  }
  std::size_t requested(int r) const {
    return request(0, 0) + n * kRequests * kRequestBytes + static_cast<std::size_t>(r) * 8;
  }
  std::uint64_t word(std::size_t off) const {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(s.base + off))
        .load(std::memory_order_acquire);
  }

  /// One pass over every peer: arrived chunks handed to their Target, get requests served, copies finished,
  /// credits returned, queued chunks started. True when something moved. Throws what the progress thread met.
  bool progress() {
    std::lock_guard lock(mu);
    if (thread_error) {
      threaded = false;  // the thread's steps end here; this thread goes on alone after reporting the error
      std::rethrow_exception(std::exchange(thread_error, nullptr));
    }
    return step();
  }
  /// The progress thread's pass: none while the caller's thread is in the route (it progresses it then).
  void thread_progress() noexcept {
    std::unique_lock lock(mu, std::try_to_lock);
    if (!lock || !threaded || thread_error) return;
    try {
      (void)step();
    } catch (...) {
      thread_error = std::current_exception();
    }
  }
  /// Queues a put of `bytes` from `src` to GPU-heap offset `off` of pe.
  void put(int pe, const void* src, std::uint64_t off, std::uint64_t bytes) {
    std::lock_guard lock(mu);
    check_peer(pe);
    peers[pe].origin->put(src, off, bytes, 0);
  }
  /// Throws Errc::protocol when pe was isolated after a protocol violation.
  void check_peer(int pe) const {
    if (!peers[pe].broken.empty()) {
      s.fail(Errc::protocol, "GPU staging",
             "rank " + std::to_string(pe) + " was isolated after a protocol violation: " + peers[pe].broken);
    }
  }
  /// The ranks of other nodes are all on the ucx route (data and signals): the only host route whose transport
  /// is thread-safe (with UBEP_PROGRESS_THREAD=1), so the progress thread may drive this route too.
  bool ucx_only() const {
    for (int pe = 0; pe < s.size; ++pe) {
      if (peers[pe].origin &&
          (s.ucx == nullptr || &s.data_route(pe) != s.ucx.get() || &s.atomics_of(pe) != s.ucx.get())) {
        return false;
      }
    }
    return true;
  }

 private:
  bool step() {
    bool moved = false;
    for (int pe = 0; pe < s.size; ++pe) {
      Peer& p = peers[pe];
      if (!p.origin || !p.broken.empty()) continue;
      try {
        moved = step_peer(pe, p) | moved;
      } catch (const Error& e) {
        if (e.code() == Errc::protocol) p.broken = e.what();  // isolated: its words are not read again
        throw;
      }
    }
    return moved;
  }
  bool step_peer(int pe, Peer& p) {
    bool moved = false;
    {
      for (int k = 0; k < kSlots; ++k) {
        if (p.arrived_seen[k] < word(arrived(pe, k))) {
          ++p.arrived_seen[k];
          staging::ChunkHeader h;
          std::memcpy(&h, s.base + inbox(pe, k), sizeof h);
          p.target->arrive(k, h);
          moved = true;
        }
      }
      for (const std::uint64_t asked = word(requested(pe)); p.requests_seen < asked;) {
        GetRequest q;
        std::memcpy(&q, s.base + request(pe, static_cast<int>(p.requests_seen % kRequests)), sizeof q);
        ++p.requests_seen;
        if (const std::string why = staging::check_get_request(q, p.requests_seen, s.device_size); !why.empty()) {
          s.fail(Errc::protocol, "GPU staging",
                 "get request " + std::to_string(p.requests_seen) + " from rank " + std::to_string(pe) +
                     " breaks the protocol: " + why);
        }
        p.origin->put(s.device_base + q.src, q.dest | kAbsolute, q.bytes, q.seq);
        moved = true;
      }
      moved = p.target->progress() | moved;
      moved = p.origin->progress() | moved;
    }
    return moved;
  }

 public:
  /// Posts get `q` to pe and returns its sequence number (the next of the pair); the caller has checked that a
  /// ring entry is free.
  std::uint64_t request_get(GetRequest q, int pe) {
    std::lock_guard lock(mu);
    check_peer(pe);
    Peer& p = peers[pe];
    q.seq = ++p.gets_sent;
    p.gets_out.push_back(q);
    // Blocking: q lives on the stack; the request is visible at pe before its count (put, then the signal)
    s.put_signal_checked(request(s.rank, static_cast<int>((q.seq - 1) % kRequests)), &q, sizeof q, requested(s.rank), 1,
                         SignalOp::add, pe, true);
    return q.seq;
  }
  /// Get `seq` from pe has its data in its destination (replies land in request order).
  bool landed(int pe, std::uint64_t seq) {
    std::lock_guard lock(mu);
    return peers[pe].gets_landed >= seq;
  }
  bool ring_full(int pe) {
    std::lock_guard lock(mu);
    return peers[pe].gets_sent - peers[pe].gets_landed >= kRequests;
  }
  bool idle() {
    std::lock_guard lock(mu);
    for (const Peer& p : peers) {
      if (p.origin && (!p.origin->idle() || p.gets_landed != p.gets_sent)) return false;
    }
    return true;
  }
  std::string pending() {
    std::lock_guard lock(mu);
    std::string out;
    for (int pe = 0; pe < s.size; ++pe) {
      const Peer& p = peers[pe];
      if (p.origin && !p.origin->idle()) out += "\n  to rank " + std::to_string(pe) + ": " + p.origin->pending();
      if (p.origin && p.gets_landed != p.gets_sent) {
        out += "\n  from rank " + std::to_string(pe) + ": gets " + std::to_string(p.gets_landed + 1) + ".." +
               std::to_string(p.gets_sent) + " awaiting their data (rank " + std::to_string(pe) +
               " sends it when it calls into ubep)";
      }
    }
    return out;
  }
};

namespace {

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
  buf[0] = {mine ? 0 : 1, s.rank};
  MPI_Request req = MPI_REQUEST_NULL;
  UBEP_MPI_CHECK(s.rank, call, MPI_Iallreduce(&buf[0], &buf[1], 1, MPI_2INT, MPI_MINLOC, s.comm, &req));
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
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(&ipc, &node_ipc, 1, MPI_INT, MPI_MIN, s.node_comm));
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
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, s.comm));
  why = "CUDA-aware MPI: MPIX_Query_cuda_support() = 1 on every rank";
  return all == 1;
}

/// Collective: the window over the GPU heap and the mpi transport on it (flushes to other nodes bounded as the
/// mpi route's, UBEP_MPI_BOUNDED).
void open_window(State& s, const char* call) {
  DeviceMemory& d = *s.device;
  UBEP_MPI_CHECK(
      s.rank, call,
      MPI_Win_create(s.device_base, static_cast<MPI_Aint>(s.device_size), 1, MPI_INFO_NULL, s.comm, &d.window));
  UBEP_MPI_CHECK(s.rank, call, MPI_Win_set_errhandler(d.window, MPI_ERRORS_RETURN));
  UBEP_MPI_CHECK(s.rank, call, MPI_Win_lock_all(MPI_MODE_NOCHECK, d.window));
  std::vector<std::uint8_t> off_node(s.size, 1);
  for (const int r : s.node_ranks) off_node[r] = 0;
  d.window_route = std::make_unique<MpiRmaTransport>(
      d.window, s.rank, s.size, false,
      !UBEP_SIMGRID && s.thread_level == MPI_THREAD_MULTIPLE && s.options.mpi_bounded != MpiBounded::off,
      s.options.mpi_bounded == MpiBounded::all, std::move(off_node), s.options.wait_timeout, s.options.poll);
}

/// Collective: this rank's heap, the node peers' mapped; s.device and s.device_base/size set on success.
void create(State& s, const char* call) {
  auto mem = std::make_unique<DeviceMemory>();
  mem->heap = make_heap(s, call);
  // Every heap must have one size (the granularity may differ between device models).
  unsigned long long size = mem->heap->size(), lo = 0, hi = 0;
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(&size, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, s.comm));
  UBEP_MPI_CHECK(s.rank, call, MPI_Allreduce(&size, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, s.comm));
  if (lo != hi) {
    s.fail(Errc::unsupported, call,
           "the GPU heaps differ in size across ranks (" + std::to_string(lo) + " to " + std::to_string(hi) +
               " bytes after rounding UBEP_GPU_HEAP_SIZE=" + std::to_string(s.options.gpu_heap_size) +
               " to each device's allocation granularity); set UBEP_GPU_HEAP_SIZE=" + std::to_string(hi));
  }
  const std::string where = s.prefix(call);
  agree_step(s, call, attempt([&] {
               mem->heap->map_node(
                   s.node_comm, s.rank, call, s.options.wait_timeout,
                   [&](MPI_Request& r) { s.wait_request(call, r, "the exchange of CUDA IPC handles"); }, where);
             }),
             "map the GPU heaps of its node peers");
  mem->alloc = HeapAllocator(0, mem->heap->size());
  mem->peer.assign(s.size, nullptr);
  for (std::size_t r = 0; r < s.node_ranks.size(); ++r)
    mem->peer[s.node_ranks[r]] = mem->heap->peer(static_cast<int>(r));
  s.device_base = mem->heap->base();
  s.device_size = mem->heap->size();
  s.device = std::move(mem);
  if (s.node_ranks.size() == static_cast<std::size_t>(s.size)) return;
  // The job spans nodes: an MPI window over the GPU heap, or the staged route, or no GPU heap at all (a later
  // alloc_device tries again).
  constexpr std::size_t kNone = ~std::size_t{0};
  std::size_t region = kNone;
  try {
    std::string why;
    if (use_window(s, call, why)) {
      s.device->window_why = why;
      open_window(s, call);
      s.device_window = s.device->window_route.get();
      return;
    }
    const std::size_t chunk = (s.options.gpu_staging_chunk + 63) / 64 * 64;
    const std::size_t bytes = StagedRoute::region_bytes(s.size, chunk);
    const char* what = "alloc_device (the staged route's host buffers, UBEP_GPU_STAGING_CHUNK)";
    const std::optional<std::size_t> off = alloc_agreed(s, what, CollKind::alloc, s.heap, bytes, 64);
    // As in Context::alloc: signal messages the peers sent before the agreement (UBEP_MPI_SIGNAL=message) are
    // applied now, so none lands later in a word of a freed object whose block the counters below reuse.
    s.apply_sent_signal_messages(what);
    if (!off) throw_out_of_heap(s, what, s.heap, s.heap_size, "UBEP_HEAP_SIZE", bytes, 64);
    region = *off;
    std::memset(s.base + region, 0, bytes);
    // No rank may send a chunk before every rank has zeroed its counters.
    s.collective(what, CollKind::signals, {static_cast<std::int64_t>(bytes)}, {"bytes"});
    s.device->staged = std::make_unique<StagedRoute>(s, region, chunk);
    s.staged = s.device->staged.get();
    // The progress thread (UBEP_PROGRESS_THREAD=1, or the ucx route's own) drives the route too where it is
    // thread-safe; the same answer on every rank: routes are symmetric.
    if (s.progress_thread.joinable() && s.staged->ucx_only()) {
      s.staged->threaded = true;
      s.thread_staged.store(s.staged, std::memory_order_release);
    }
  } catch (...) {
    if (region != kNone) s.release(region);
    s.device_window = nullptr;
    s.device.reset();
    s.device_base = nullptr;
    s.device_size = 0;
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
  if (StagedRoute* r = thread_staged.load(std::memory_order_acquire)) r->thread_progress();
}

void State::progress_staged() {
  if (staged->progress()) flush_pending_signals();  // credits on the mpi route go out now, not at the next call
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
                 s.staged->pending());
    }
    if (s.staged->progress()) {
      s.flush_pending_signals();
      continue;
    }
    if (s.ucx) s.ucx->poll();
    if (backoff.pause()) {
      if (s.mpi) {
        s.mpi->progress(s.comm);
      } else {  // MPI's progress all the same: a target may be inside an MPI call of another context that
                // completes only with this process's MPI progress (osc ucx accumulates), before it drains ours
        int flag = 0;
        UBEP_MPI_CHECK(s.rank, call, MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, s.comm, &flag, MPI_STATUS_IGNORE));
      }
    }
  }
}

}  // namespace

void State::synchronize_device(const char* call) {
  device->heap->synchronize(prefix(call));
  if (device->window_route && device->window_route->outstanding()) device->window_route->flush_all();
  if (staged && !staged->idle()) drive_staged(*this, call, [this] { return staged->idle(); });
  device_pending = false;
}

namespace {

/// The offset of [addr, addr + bytes) in the GPU heap and pe's heap as mapped here (null: another node, reached
/// by the window or the staged route); throws naming the call.
std::pair<std::size_t, char*> device_target(State& s, const char* call, const void* addr, std::size_t bytes, int pe) {
  const std::size_t off = check_heap_range(s, call, addr, bytes, s.device_base, s.device_size, s.device->alloc,
                                           "symmetric GPU heap", "pass a pointer into an object from alloc_device");
  return {off, s.device->peer[pe]};
}

}  // namespace

void State::device_put(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete) {
  const auto [off, peer] = device_target(*this, call, dest, bytes, pe);
  if (peer != nullptr) {
    device->heap->copy_async(peer + off, src, bytes, prefix(call));
  } else if (device->window_route) {  // complete at synchronize_device's flush (below, or at quiet())
    device->window_route->put_nbi(off, src, bytes, pe);
  } else {
    staged->put(pe, src, off, bytes);
    progress_staged();  // the first chunks start now
  }
  device_pending = true;
  if (complete) synchronize_device(call);
}

void State::device_get(const char* call, void* dest, const void* src, std::size_t bytes, int pe, bool complete) {
  const auto [off, peer] = device_target(*this, call, src, bytes, pe);
  if (peer != nullptr) {
    device->heap->copy_async(dest, peer + off, bytes, prefix(call));
  } else if (!device->window_route) {  // the staged route: pe sends the data when it calls into ubep
    if (staged->ring_full(pe)) drive_staged(*this, call, [&] { return !staged->ring_full(pe); });
    const std::uint64_t seq =
        staged->request_get(GetRequest{off, bytes, reinterpret_cast<std::uintptr_t>(dest), 0}, pe);
    progress_staged();
    device_pending = true;
    // get waits for its own data only, not for this rank's other staged transfers (quiet() does that)
    if (complete) drive_staged(*this, call, [&] { return staged->landed(pe, seq); });
    return;
  } else if (complete) {
    device->window_route->get(dest, off, bytes, pe);  // dest holds the data on return
  } else {
    device->window_route->get_nbi(dest, off, bytes, pe);
  }
  device_pending = true;
  if (complete) synchronize_device(call);
}

void* State::device_ptr(const char* call, const void* dest, std::size_t bytes, int pe) {
  const std::size_t off = check_heap_range(*this, call, dest, bytes, device_base, device_size, device->alloc,
                                           "symmetric GPU heap", "pass a pointer into an object from alloc_device");
  char* peer = device->peer[pe];
  return peer ? peer + off : nullptr;
}

bool State::release_device(std::size_t offset) noexcept { return device && device->alloc.release(offset); }

}  // namespace detail

using detail::State;

void* Context::alloc_device_bytes(std::size_t count, std::size_t elem_size, std::size_t align) {
  State& s = *state_;
  const char* call = "alloc_device";
  const std::size_t bytes = detail::alloc_request(s, call, count, elem_size, align, detail::kDeviceAlign);
  s.quiet();  // device copies too: nothing aimed at a freed object lands in the new one
  if (!s.device) detail::create(s, call);
  const std::optional<std::size_t> off =
      detail::alloc_agreed(s, call, detail::CollKind::alloc_device, s.device->alloc, bytes, align);
  if (bytes == 0) return nullptr;
  if (!off) detail::throw_out_of_heap(s, call, s.device->alloc, s.device_size, "UBEP_GPU_HEAP_SIZE", bytes, align);
  return s.device_base + *off;
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
  if (!s.device) {
    std::memcpy(dst, src, bytes);
    return;
  }
  s.device->heap->copy_async(dst, src, bytes, s.prefix(call));
  s.device->heap->synchronize(s.prefix(call));
}

namespace detail {

std::string gpu_heap_description(const State& s) {
  if (!s.device) {
    return "not created (the first alloc_device creates UBEP_GPU_HEAP_SIZE=" + std::to_string(s.options.gpu_heap_size) +
           (s.options.gpu_emulate ? " bytes of host memory EMULATING a GPU: UBEP_GPU_EMULATE=1, testing)"
                                  : " bytes on the current CUDA device)");
  }
  return s.device->heap->describe();
}

std::string gpu_path(const State& s, int pe) {
  if (pe == s.rank) return "self: copies within this rank's GPU heap";
  if (std::find(s.node_ranks.begin(), s.node_ranks.end(), pe) != s.node_ranks.end())
    return "CUDA IPC: the node peer's GPU heap mapped here, copies on ubep's stream";
  if (s.device && s.device->window_route) {
    return "MPI window: another node, MPI_Put/MPI_Get on a window over the GPU heap (" + s.device->window_why + ")";
  }
  if (!s.device && s.options.gpu_mpi_window != GpuMpiWindow::off) {  // decided by the first alloc_device
    const std::string window = s.options.gpu_mpi_window == GpuMpiWindow::on ? "UBEP_GPU_MPI_WINDOW=1"
                               : cuda_aware_mpi() == 1                      ? "if every rank's MPI is CUDA-aware"
                                                                            : "";
    if (!window.empty()) {
      return "MPI window: another node, MPI_Put/MPI_Get on a window over the GPU heap (" + window +
             ", decided at the first alloc_device)";
    }
  }
  return std::string("staged: another node, device -> host -> route ") + to_string(s.routes[pe]) +
         " -> host -> device in chunks of UBEP_GPU_STAGING_CHUNK=" + std::to_string(s.options.gpu_staging_chunk) +
         " (a get asks the peer to send)" + (s.staged && s.staged->threaded ? "; the progress thread drives it" : "");
}

}  // namespace detail
}  // namespace ubep
