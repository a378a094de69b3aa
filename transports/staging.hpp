// The staged route for GPU memory between nodes whose MPI is not CUDA-aware (issue 15): device -> registered
// host slot -> the wire (MPI_Put or the UCX route) -> the target's host slot -> device, in pipelined chunks.
// This file is the protocol alone, over two interfaces: a CopyEngine (asynchronous copies between device and
// host memory: CUDA streams on a GPU, host memory in the tests) and a Wire (a chunk into one of the target's
// slots, visible there with its header; a credit back when the target has drained the slot). No CUDA and no
// MPI here: tests/unit/staging_test.cpp drives both sides in one process with host-memory fakes.
//
// Per (origin, target) pair the target owns `slots` host buffers of `chunk_bytes`; a slot is a credit. The
// origin copies chunk k of a transfer into a free slot of its own, sends it when that copy is done, and reuses
// the slot when the target returns its credit, so at most `slots` chunks are in flight (back-pressure). The
// target copies each arrived chunk into its device memory, returns the credit when that copy is done, and
// completes the transfer (the caller's signal, after the data) once every byte of it is on the device: chunks
// may finish out of order, completion never precedes one of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ubep::detail::staging {

/// Asynchronous copies between device and host memory. Tickets are per engine; done() polls and throws
/// ubep::Error when the copy failed (the engine's message names the copy).
class CopyEngine {
 public:
  using Ticket = std::uint64_t;
  virtual ~CopyEngine() = default;
  virtual Ticket to_host(void* host, const void* device, std::size_t bytes) = 0;
  virtual Ticket to_device(void* device, const void* host, std::size_t bytes) = 0;
  virtual bool done(Ticket t) = 0;
};

/// What travels with each chunk.
struct ChunkHeader {
  std::uint64_t transfer = 0;  ///< the origin's transfer id (per origin, increasing)
  std::uint64_t offset = 0;    ///< of the chunk in the transfer
  std::uint64_t bytes = 0;     ///< of this chunk
  std::uint64_t total = 0;     ///< of the whole transfer
  std::uint64_t dest = 0;      ///< the transfer's destination on the target (a device address there)
  std::uint64_t signal = 0;    ///< opaque: what the target completes when the transfer has landed
};

/// The origin's half of the wire to one target.
class Wire {
 public:
  virtual ~Wire() = default;
  /// Puts `bytes` from `src` (a host slot of the origin) into the target's slot `slot`, the header visible
  /// there only after the data (put, then the header as the slot's signal).
  virtual void send(int slot, const void* src, const ChunkHeader& h) = 0;
  /// The slots whose credit the target returned since the last call (each returned once).
  virtual std::vector<int> credits() = 0;
};

/// A destination with this bit is an address in the target's own memory (a get's reply), else an offset in its
/// GPU heap. User-space addresses are below 2^57 on every 64-bit platform CUDA runs on.
inline constexpr std::uint64_t kAbsolute = std::uint64_t{1} << 63;

/// A get request, as it travels (one put into the server's ring).
struct GetRequest {
  std::uint64_t src = 0;    ///< offset in the server's GPU heap
  std::uint64_t bytes = 0;  ///< to send
  std::uint64_t dest = 0;   ///< address in the requester's memory (host or GPU)
  std::uint64_t seq = 0;    ///< per (requester, server) pair: 1, 2, ...
};

/// A get request read from the server's ring, checked before the server serves it: its sequence number the one
/// expected, [src, src + bytes) inside the `heap_bytes`-byte GPU heap, dest not marked kAbsolute (the server
/// marks it). Empty when valid, else what is wrong, naming the field.
std::string check_get_request(const GetRequest& q, std::uint64_t expected_seq, std::uint64_t heap_bytes);

struct Config {
  std::size_t chunk_bytes = 1u << 20;  ///< bytes per chunk and per slot
  int slots = 4;                       ///< host slots per (origin, target) pair: the chunks in flight
};

/// The origin side toward one target: put(...) queues a transfer, progress() moves it on (call it until
/// idle()). Throws ubep::Error: invalid_argument for a bad config or transfer; what the engine throws, with
/// the transfer and chunk; timeout from the caller's deadline is the caller's (progress() never blocks).
class Origin {
 public:
  /// `host_slots`: `config.slots` host buffers of `config.chunk_bytes` each (registered memory on a GPU).
  Origin(Config config, CopyEngine& engine, Wire& wire, std::vector<void*> host_slots);
  /// Queues `bytes` from device `src` to `dest` on the target; `signal` is completed there after the data.
  /// Returns the transfer id. bytes 0 sends one empty chunk (the signal alone, still after earlier data).
  std::uint64_t put(const void* src, std::uint64_t dest, std::uint64_t bytes, std::uint64_t signal);
  /// One step: returned credits free their slots, finished copies are sent, free slots start copies.
  /// Returns true when it changed something.
  bool progress();
  /// Nothing queued, copying or awaiting a credit.
  bool idle() const;
  /// For reports: "transfer 3 at offset 1048576 (slot 2, awaiting its credit)" per unfinished chunk.
  std::string pending() const;
  /// The most slots this origin has had in use at once (back-pressure checks).
  int max_in_flight() const { return max_in_flight_; }

 private:
  struct Transfer {
    std::uint64_t id;
    const std::byte* src;
    std::uint64_t dest, bytes, signal, next;  // next: offset of the next chunk to start
  };
  enum class SlotState { free, copying, sent };
  struct Slot {
    void* host = nullptr;
    SlotState state = SlotState::free;
    CopyEngine::Ticket ticket = 0;
    ChunkHeader header;
  };
  Config config_;
  CopyEngine& engine_;
  Wire& wire_;
  std::vector<Slot> slots_;
  std::deque<Transfer> queue_;
  std::uint64_t next_id_ = 1;
  int in_flight_ = 0, max_in_flight_ = 0;
};

/// The target side for one origin: arrive(slot, header) when the slot's header has become visible, progress()
/// to drain; `credit(slot)` returns a slot to the origin, `complete(header)` completes a transfer's signal.
class Target {
 public:
  Target(Config config, CopyEngine& engine, std::vector<void*> host_slots, std::function<void(int)> credit,
         std::function<void(const ChunkHeader&)> complete);
  /// A chunk is in `slot` (its data visible before its header), in any order. The header is the origin's, so
  /// untrusted: throws ubep::Error (protocol, naming the field) on a slot out of range or still busy, a chunk
  /// larger than a slot or past its transfer's end, a transfer already completed or too far ahead, a header that
  /// contradicts the transfer's earlier chunks (total, dest, signal), or a destination that check_dest refuses;
  /// nothing is copied then.
  void arrive(int slot, const ChunkHeader& h);
  /// Where a transfer may land: returns an empty string for a header whose [dest, dest + total) the target owns
  /// (checked at a transfer's first chunk), else why not. None set: every destination is taken.
  void set_dest_check(std::function<std::string(const ChunkHeader&)> check) { check_dest_ = std::move(check); }
  bool progress();
  bool idle() const;

 private:
  struct Busy {
    int slot;
    CopyEngine::Ticket ticket;
    ChunkHeader header;
  };
  Config config_;
  CopyEngine& engine_;
  std::vector<void*> slots_;
  std::vector<bool> busy_;
  std::function<void(int)> credit_;
  std::function<void(const ChunkHeader&)> complete_;
  std::function<std::string(const ChunkHeader&)> check_dest_;
  std::deque<Busy> copying_;
  // Bytes on the device per unfinished transfer. Transfers complete in id order whatever order their chunks
  // arrive and land in (ids are consecutive per origin), so signals become visible in the origin's put order.
  struct Landing {
    ChunkHeader first;  // total, dest and signal: every chunk must agree
    std::uint64_t landed = 0, arrived = 0;
  };
  std::map<std::uint64_t, Landing> landing_;
  std::uint64_t next_complete_ = 1;
};

}  // namespace ubep::detail::staging
