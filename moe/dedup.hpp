// ubep's per_rank and per_node dispatch/combine (private to moe/: layer.cpp constructs and calls it; the source
// and owner sides are in dedup.cpp, the relay in dedup_relay.cpp) (moe.hpp, "Combine modes"). A source sends each
// token once to each target: an owner rank (its own node, or every node under per_rank), or, under per_node, the
// relay rank of a remote node. A target's copy is one record: the token (and its e4m3 scale), then the token's
// experts at that target (owner, local expert, weight) in k order. Buffers per rank (Shape's sizes: `sets` =
// UBEP_RUN_AHEAD buffer sets, call c uses set c % sets; `max_tokens` = max_tokens_per_rank; `inbox_slots` = the
// most sources a rank relays for; `node_size` = the most ranks on a node):
//   chunk_buf [sets][ranks]   owner chunks: chunk (set, source) holds source's records for this owner, written by
//                             the source or by the source's relay on this node; header: records, reply rank,
//                             reply offset, reply signal. A record from a source that writes it itself over
//                             load/store carries, in place of the token, the token's row in that source's
//                             token_buf (uint32): the owner gathers it straight into the expert's batch (a token
//                             moves once to the stage and once per expert, not once per owner and again per
//                             expert). A relay forwards records over load/store the same way, with the record's
//                             index in its inbox: the owner gathers from the inbox. Relayed records over the
//                             network carry the token.
//   token_buf [sets][max_tokens]  this rank's tokens of the call (rows of token_stride), staged once for the
//                             owners that gather from it
//   inbox_buf [sets][inbox_slots]  relay inboxes: inbox slot i is the i-th remote source this rank relays for;
//                             header: records, the byte offset of the node rows in the source's row_buf
//   row_buf   [sets][max_tokens x min(topk, ranks)] rows at a source (partial rows of its direct owners, node
//                             rows of its relays),
//             [sets][inbox_slots][max_tokens x min(topk, node_size)] partial rows at a relay, from the owners
//                             of its node, per inbox slot
//   signal_buf  one array: chunk signals, inbox signals, row signals (at a source, per writer), partial-row
//               signals (at a relay, per inbox slot and owner), release signals (at a writer, per receiver)
// An owner replies where its chunk's header says (the source, or the relay), so it needs no topology. A relay
// forwards an inbox to every owner of its node (also with no records: the owner counts one chunk per source),
// then sums the owners' partial rows per record in owner rank order and sends one node row back. It releases
// the inbox to its source once every owner that got records has sent its partial rows (they may gather from it).
// Every wait of the layer goes through serve(), which runs the relay's work, so a relay forwards in whatever
// call its caller is in; a rank's combine_recv(c) also finishes its relay work of call c. With
// UBEP_MOE_RELAY_THREAD=1 a thread of the layer runs progress() too, while calls are in flight and the
// application is outside the layer: `mu` makes it and the layer calls take turns (each call holds it).
// Back-pressure as in per_expert: a writer writes call c into a receiver's set only after the receiver
// released call c - sets (release signal of the receiver at the writer >= c - sets + 1).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "moe/layer_impl.hpp"
#include "ubep/topology.hpp"

namespace ubep::moe {
namespace dedup {

/// The tag of call `call` in a chunk, inbox or row signal: (call + 1) << 32, or'd with a count.
constexpr std::uint64_t tag(std::uint64_t call) { return (call + 1) << 32; }
constexpr std::size_t kHeader = 64;  // bytes of a chunk or inbox header
/// Whether a route moves bytes as messages (staged, then one put_signal), not by load/store.
inline bool packed(Route route) { return route == Route::mpi || route == Route::ucx; }

/// A record: the token (token_bytes) or its row in the source's token_buf, in `token_slot` = max(token_bytes, 4)
/// bytes, its entry count (4 bytes), then its entries from here.
constexpr std::size_t entries_at(std::size_t token_slot) { return (token_slot + 4 + 3) / 4 * 4; }

/// Sets `signal` on pe to `value`, with no data.
void notify(Context& ctx, std::uint64_t* signal, std::uint64_t value, int pe);

/// Everything about the buffers that follows from the config and the node map (the same on every rank).
struct Shape {
  std::size_t ranks = 1, sets = 1, max_tokens = 0, max_local = 1, topk = 1, node_size = 1, inbox_slots = 0;
  bool relays = false;                             // per_node across more than one node
  std::vector<int> node_of, index_in_node;         // per rank: node, index among its node's ranks
  std::vector<std::vector<int>> node_ranks;        // ranks per node, ascending
  std::vector<std::vector<int>> relayed;           // per rank: the remote sources it relays for, ascending (its slots)
  std::vector<std::uint8_t> node_has_experts;      // per node
  std::size_t token_bytes = 0;                     // a token and its e4m3 scale
  std::size_t token_slot = 0;                      // a record's token, or its row in the source's token_buf (uint32)
  std::size_t staged_stride = 0;                   // a row of token_buf
  std::size_t owner_record = 0, inbox_record = 0;  // bytes of a record in a chunk, in an inbox
  std::size_t chunk_bytes = 0, inbox_bytes = 0;    // header and records
  std::size_t row_bytes = 0;                       // a partial or node row
  std::size_t source_rows = 0, relay_rows = 0;     // rows per set at a source, per set and inbox slot at a relay
  // Section starts in the signal array, and its length.
  std::size_t chunk_signals = 0, inbox_signals = 0, row_signals = 0, partial_signals = 0, release_signals = 0,
              signal_count = 0;

  Shape(const Config& config, const std::vector<int>& nodes, unsigned run_ahead);
  /// The relay of `source` on node `node` (moe.hpp, "Combine modes").
  int relay_of(int source, int node) const;
  /// `source`'s inbox slot at its relay on node `node`.
  std::size_t inbox_slot(int source, int node) const;
  std::size_t chunk_buf_bytes() const { return sets * ranks * chunk_bytes; }
  std::size_t token_buf_bytes() const { return sets * max_tokens * staged_stride; }
  std::size_t inbox_buf_bytes() const { return sets * inbox_slots * inbox_bytes; }
  std::size_t row_buf_rows() const { return sets * (source_rows + inbox_slots * relay_rows); }
  std::size_t heap() const;
};

}  // namespace dedup

std::size_t dedup_heap_bytes(const Config& config, const std::vector<int>& node_of, unsigned run_ahead);
std::size_t dedup_heap_bytes(const Config& config, const Topology& topology, unsigned run_ahead);

struct OneSidedImpl::Dedup {
  /// Where a relay is with a (set, inbox slot): awaiting its source's inbox, forwarding it to the owners of its
  /// node (to each once that owner released the set), awaiting the partial rows of the owners that got records.
  enum class Phase { awaiting_inbox, forwarding, awaiting_partial_rows };
  /// Relay work per (set, inbox slot).
  struct RelaySlot {
    std::uint64_t call = 0;  // the call this (set, inbox slot) serves now
    Phase phase = Phase::awaiting_inbox;
    std::size_t records = 0;                     // inbox records
    std::uint64_t reply_offset = 0;              // byte offset of the node rows in the source's row_buf
    std::vector<std::uint8_t> forwarded;         // [local_owners]
    std::vector<std::size_t> owner_records;      // [local_owners] records forwarded to each owner
    std::vector<std::size_t> owner_first_row;    // [local_owners] first relay row of each owner
    std::vector<std::uint32_t> record_rows_end;  // [records] end of record j's rows in record_rows
    std::vector<std::uint32_t> record_rows;      // relay rows of each record, owners ascending
  };
  /// What a staging copy holds (the top byte of its key).
  enum class Staged : std::uint64_t { chunk = 0, partial_rows = 1, forwarded_chunk = 2, node_rows = 3 };

  /// Writes a region of `bytes` on pe: straight into pe's copy on a load/store route (mapped here through
  /// ctx.ptr, one range check for the region), into a staging copy sent as one put_signal_nbi on a network
  /// route. Either way `dest` is where the region's bytes go.
  struct RegionWriter {
    Dedup& parent;
    int pe;
    std::byte* remote;
    bool packed;
    std::byte* dest = nullptr;
    std::size_t extent = 0;
    RegionWriter(Dedup& layer_dedup, int target, std::byte* region, std::uint64_t key, std::size_t bytes);
    void write(std::size_t offset, const void* from, std::size_t n);
    /// Where a row at `offset` can be computed in place.
    std::byte* in_place(std::size_t offset, std::size_t n);
    void finish(std::size_t signal, std::uint64_t value);
  };

  OneSidedImpl& layer;
  Context& ctx;
  dedup::Shape shape;
  int rank = 0;
  bool float_rows = false;  // partial and node rows are f32 (else bf16)
  Symmetric<std::byte> chunk_buf, token_buf, inbox_buf, row_buf;
  Symmetric<std::uint64_t> signal_buf;
  std::vector<std::uint64_t> awaited, seen;  // per signal: value awaited (kSignalIgnored: none), value seen
  std::vector<int> writer_of;                // per signal: its writer, for timeout reports
  std::vector<int> schedule;
  std::vector<int> reduction_order;  // ranks by (node, rank)
  std::vector<int> chunk_writers;    // ranks that write into our chunk_buf (our releases go to them)
  std::vector<int> local_owners;     // ranks of our node with experts, ascending (relay targets)
  bool ucx = false;
  // Owner releases (as per_expert): calls 0 .. released_calls-1 released; set_received[set] waits for older calls.
  std::uint64_t released_calls = 0;
  std::vector<std::uint8_t> set_received;
  std::vector<RelaySlot> relay_slots;                      // [sets x inbox_slots]
  std::vector<std::uint64_t> inbox_released;               // [inbox_slots] calls released to the slot's source
  std::vector<std::uint8_t> inbox_done;                    // [sets x inbox_slots] done, release not yet sent
  std::map<std::uint64_t, std::vector<std::byte>> stages;  // staging copies for the network routes
  std::size_t hidden = 0;
  // The relay thread (UBEP_MOE_RELAY_THREAD=1, per_node across nodes): while `in_flight` calls are between
  // dispatch_send and combine_recv it runs progress() whenever no layer call holds `mu`, backing off while
  // nothing moves. What it sends is counted into `thread_counts`, and an error it meets into `thread_error`,
  // both taken over by the next layer call (enter()).
  struct Count {
    bool dispatch;
    int pe;
    std::size_t bytes;
  };
  mutable std::mutex mu;
  std::thread relay_thread;
  std::atomic<bool> relay_stop{false};
  std::uint64_t in_flight = 0;
  std::vector<Count> thread_counts;
  std::exception_ptr thread_error;

  Dedup(OneSidedImpl& parent, Context& context);
  ~Dedup();
  Dedup(const Dedup&) = delete;
  Dedup& operator=(const Dedup&) = delete;
  /// Taken by every layer call while the relay thread runs (else an empty lock): waits for the thread's pass,
  /// counts what it sent, and throws the error it met, if any.
  [[nodiscard]] std::unique_lock<std::mutex> enter();
  /// Why this rank cannot run the relay thread (empty: it can).
  std::string relay_thread_refused() const;
  void relay_loop();
  /// layer.count, from either thread.
  void count_sent(bool dispatch, int pe, std::size_t bytes);

  /// Whether `source` writes straight to `owner` (else through source's relay on owner's node).
  bool writes_direct(int source, int owner) const {
    return !shape.relays || shape.node_of[source] == shape.node_of[owner];
  }
  /// Whether `owner` gathers `source`'s tokens from source's token_buf (source writes owner's chunk itself, over
  /// load/store; routes are symmetric, so both sides agree).
  bool owner_gathers(int source, int owner) const;
  std::size_t my_inbox_slots() const { return shape.relayed[rank].size(); }

  /// True once signal `signal` was seen at `value` or more; else arms it for the next wait.
  bool ready(std::size_t signal, std::uint64_t value);
  /// Runs the relay work and waits for signals until pred() holds.
  void serve(const std::function<bool()>& pred, const char* what);
  /// Relay work without waiting: each armed signal is tested once (Context::test), and what became
  /// ready runs, until nothing moves. True if anything moved.
  bool progress();
  /// What the armed signals stand for, naming the source rank behind each relay (for timeout reports).
  std::string awaited_report() const;
  /// A staging copy for a message on a network route, reused once UCX is done with its last send.
  std::byte* stage(std::uint64_t key, std::size_t bytes, int pe);
  static std::uint64_t stage_key(Staged kind, std::uint64_t set, std::uint64_t index) {
    return (static_cast<std::uint64_t>(kind) << 56) | (set << 40) | index;
  }
  [[noreturn]] void internal(const std::string& what) const;
  /// A peer's header or record failed its check (moe/wire.hpp): Errc::protocol naming the peer, call and field.
  void protocol(const std::string& why, const char* what, int from, std::uint64_t call) const;

  // Relay (dedup_relay.cpp).
  /// Advances every (set, inbox slot); true if anything moved.
  bool relay_work();
  bool advance_slot(std::size_t set, std::size_t slot);
  /// Calls f(owner_index) for each local owner (index into local_owners) that inbox record `record` names.
  template <class F>
  void for_owners(const std::byte* record, F&& f) const;
  void forward(std::size_t set, std::size_t slot, int source, std::size_t owner_index, const RelaySlot& relay,
               const std::byte* inbox);
  void send_node_rows(std::size_t set, std::size_t slot, int source, const RelaySlot& relay);

  // Source.
  /// The target of an expert owned by `owner`: the owner itself, or the owner's node's relay.
  int target_of(int owner) const {
    return writes_direct(rank, owner) ? owner : shape.relay_of(rank, shape.node_of[owner]);
  }
  void send(HandleState& state, std::span<const std::byte> tokens, std::span<const float> scales);
  void combine_recv(HandleState& state, std::span<float> out);

  // Owner.
  std::optional<int> next_expert(HandleState& state);
  /// Waits for every source's chunk of this call and copies its bookkeeping out of the buffers.
  void receive(HandleState& state);
  void regroup(HandleState& state, int local);
  /// Everything of this call is out of our chunks: release it to the writers, in call order.
  void release(HandleState& state);
  void dispatch_recv(HandleState& state);
  /// Expert `local`'s outputs: each record whose last expert this is gets its partial row now (its experts
  /// in k order: this expert's row from `outputs`, the others' from the copies kept for it); the rows of
  /// records still waiting for another expert are copied. The last local expert sends the partial rows.
  void combine_send(HandleState& state, int local, std::span<const std::byte> outputs);

  std::size_t buffer_bytes() const;
};

}  // namespace ubep::moe
