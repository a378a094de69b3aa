// The staged route of the symmetric GPU heap (runtime/device.cpp): GPU-heap data to and from peers on other
// nodes through this rank's host routes (private to the runtime layer).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device_memory.hpp"
#include "runtime/state.hpp"
#include "transports/staging.hpp"

namespace ubep::detail {

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

struct StagedRoute {
  static constexpr int kSlots = 2;
  static constexpr std::size_t kHeader = 64;
  static_assert(sizeof(staging::ChunkHeader) <= kHeader);
  static constexpr int kRequests = 4;
  using GetRequest = staging::GetRequest;
  static constexpr auto kAbsolute = staging::kAbsolute;
  static constexpr std::size_t kRequestBytes = 32;
  static_assert(sizeof(GetRequest) == kRequestBytes);
  /// The copy engine of both sides: the heap's copies, done when the copy stream has passed them. On the
  /// target side a "device address" is an offset in this rank's GPU heap (what the origin can name).
  struct Engine final : staging::CopyEngine {
    State& s;
    char* device_base;  // null on the origin side: addresses are pointers already
    Ticket next = 0;
    Engine(State& state, char* base) : s(state), device_base(base) {}
    Ticket to_host(void* host, const void* device, std::size_t bytes) override {
      s.gpu.memory->heap->copy_async(host, device, bytes, s.prefix("GPU staging"));
      return ++next;
    }
    Ticket to_device(void* device, const void* host, std::size_t bytes) override {
      const auto addr = reinterpret_cast<std::uintptr_t>(device);
      char* to = (addr & kAbsolute) ? reinterpret_cast<char*>(addr & ~kAbsolute) : device_base + addr;
      s.gpu.memory->heap->copy_async(to, host, bytes, s.prefix("GPU staging"));
      return ++next;
    }
    bool done(Ticket) override {
      s.gpu.memory->heap->synchronize(s.prefix("GPU staging"));
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
      r.s.put_signal_checked(r.inbox(r.s.comms.rank, slot), data - kHeader, kHeader + h.bytes,
                             r.arrived(r.s.comms.rank, slot), 1, SignalOp::add, pe, false);
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
        n(static_cast<std::size_t>(state.comms.size)),
        origin_engine(state, nullptr),
        target_engine(state, state.gpu.base),
        peers(n) {
    const staging::Config config{chunk, kSlots};
    for (int pe = 0; pe < s.comms.size; ++pe) {
      if (s.gpu.memory->peer[pe] != nullptr) continue;  // this node: CUDA IPC
      Peer& p = peers[pe];
      std::vector<void*> out_slots, in_slots;
      for (int k = 0; k < kSlots; ++k) {
        out_slots.push_back(s.heap.base + outbox(pe, k) + kHeader);
        in_slots.push_back(s.heap.base + inbox(pe, k) + kHeader);
      }
      p.wire = std::make_unique<PeerWire>(*this, pe);
      p.origin = std::make_unique<staging::Origin>(config, origin_engine, *p.wire, std::move(out_slots));
      p.target = std::make_unique<staging::Target>(
          config, target_engine, std::move(in_slots),
          [this, pe](int k) { s.signal_checked(credit(s.comms.rank, k), 1, SignalOp::add, pe, false); },
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
    if (h.dest > s.gpu.size || h.total > s.gpu.size - h.dest) {
      return "field 'dest' = " + std::to_string(h.dest) + ": [dest, +" + std::to_string(h.total) +
             " bytes) is outside the " + std::to_string(s.gpu.size) + "-byte GPU heap";
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
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(s.heap.base + off))
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
    for (int pe = 0; pe < s.comms.size; ++pe) {
      if (peers[pe].origin && (s.routes.ucx == nullptr || &s.data_route(pe) != s.routes.ucx.get() ||
                               &s.atomics_of(pe) != s.routes.ucx.get())) {
        return false;
      }
    }
    return true;
  }

 private:
  bool step() {
    bool moved = false;
    for (int pe = 0; pe < s.comms.size; ++pe) {
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
          std::memcpy(&h, s.heap.base + inbox(pe, k), sizeof h);
          p.target->arrive(k, h);
          moved = true;
        }
      }
      for (const std::uint64_t asked = word(requested(pe)); p.requests_seen < asked;) {
        GetRequest q;
        std::memcpy(&q, s.heap.base + request(pe, static_cast<int>(p.requests_seen % kRequests)), sizeof q);
        ++p.requests_seen;
        if (const std::string why = staging::check_get_request(q, p.requests_seen, s.gpu.size); !why.empty()) {
          s.fail(Errc::protocol, "GPU staging",
                 "get request " + std::to_string(p.requests_seen) + " from rank " + std::to_string(pe) +
                     " breaks the protocol: " + why);
        }
        p.origin->put(s.gpu.base + q.src, q.dest | kAbsolute, q.bytes, q.seq);
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
    s.put_signal_checked(request(s.comms.rank, static_cast<int>((q.seq - 1) % kRequests)), &q, sizeof q,
                         requested(s.comms.rank), 1, SignalOp::add, pe, true);
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
    for (int pe = 0; pe < s.comms.size; ++pe) {
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

}  // namespace ubep::detail
