// ubep's per_rank and per_node dispatch/combine (private to moe/, included by layer.cpp only) (moe.hpp, "Combine
// modes"). A source sends each token once to each target: an owner rank (its own node, or every node under per_rank),
// or, under per_node, the relay rank of a remote node. A target's copy is one record: the token (and its e4m3 scale),
// then the token's experts at that target (owner, local expert, weight) in k order. Buffers per rank (S =
// UBEP_RUN_AHEAD sets, call c uses set c % S):
//   dbuf [S][ranks]       owner chunks: chunk (set, s) holds source s's records for this owner, written by s
//                         or by s's relay on this node; header: records, reply rank, reply offset, reply signal.
//                         A record from a source that writes it itself over load/store carries, in place of
//                         the token, the token's row in that source's tbuf (uint32): the owner gathers it
//                         straight into the expert's batch (a token moves once to the stage and once per
//                         expert, not once per owner and again per expert). A relay forwards records over
//                         load/store the same way, with the record's index in its inbox: the owner gathers from
//                         the inbox. Relayed records over the network carry the token.
//   tbuf [S][M]           this rank's tokens of the call (rows of token_stride), staged once for the owners
//                         that gather from it
//   ibuf [S][Q]           relay inboxes: slot q is the q-th remote source this rank relays for; header:
//                         records, the byte offset of the node rows in the source's row buffer
//   rbuf [S][M x min(k,P)] rows at a source (partial rows of its direct owners, node rows of its relays),
//        [S][Q][M x min(k,N)] partial rows at a relay, from the owners of its node, per slot
//   sig  one array: chunk signals D, inbox signals I, row signals C (at a source, per writer), partial-row
//        signals Ps (at a relay, per slot and owner), releases R (at a writer, per receiver)
// An owner replies where its chunk's header says (the source, or the relay), so it needs no topology. A relay
// forwards an inbox to every owner of its node (also with no records: the owner counts one chunk per source),
// then sums the owners' partial rows per record in owner rank order and sends one node row back. It releases
// the inbox to its source once every owner that got records has sent its partial rows (they may gather from it).
// Every wait of the layer goes through serve(), which runs the relay's work, so a relay forwards in whatever
// call its caller is in; a rank's combine_recv(c) also finishes its relay work of call c.
// Back-pressure as in per_expert: a writer writes call c into a receiver's set only after the receiver
// released call c - S (R[receiver] at the writer >= c - S + 1).
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <string>

#include "moe/handle.hpp"
#include "moe/kernels.hpp"
#include "moe/wire.hpp"
#include "ubep/moe.hpp"
#include "ubep/topology.hpp"

namespace ubep::moe {
namespace dedup {

constexpr std::uint64_t tag(std::uint64_t call) { return (call + 1) << 32; }
constexpr std::size_t up64(std::size_t b) { return (b + 63) / 64 * 64; }
constexpr std::size_t up16(std::size_t b) { return (b + 15) / 16 * 16; }
constexpr std::size_t kHeader = 64;  // bytes of a chunk or inbox header
inline bool packed(Route r) { return r == Route::mpi || r == Route::ucx; }

/// A record: the token (tok bytes) or its row in the source's tbuf, in `tok_slot` = max(tok, 4) bytes, its entry
/// count (4 bytes), then its entries from here.
constexpr std::size_t entries_at(std::size_t tok_slot) { return (tok_slot + 4 + 3) / 4 * 4; }

/// Everything about the buffers that follows from the config and the node map (the same on every rank).
struct Shape {
  std::size_t P = 1, S = 1, M = 0, L = 1, k = 1, N = 1, Q = 0;
  bool relays = false;                    // per_node across more than one node
  std::vector<int> node, index;           // per rank: node, index among its node's ranks
  std::vector<std::vector<int>> nodes;    // ranks per node, ascending
  std::vector<std::vector<int>> slots;    // per rank: the remote sources it relays for, ascending
  std::vector<std::uint8_t> has_experts;  // per node
  std::size_t tok = 0, tok_slot = 0, tstride = 0, rec_o = 0, rec_i = 0, region_o = 0, region_i = 0, rb = 0,
              src_rows = 0, cin_rows = 0;
  std::size_t D = 0, I = 0, C = 0, Ps = 0, R = 0, signals = 0;  // section starts in the signal array

  Shape(const Config& c, const std::vector<int>& node_of, unsigned run_ahead) {
    P = node_of.size();
    S = run_ahead;
    M = static_cast<std::size_t>(c.max_tokens_per_rank);
    const ExpertMap map{c.num_experts, static_cast<int>(P)};
    L = static_cast<std::size_t>(map.max_local());
    k = static_cast<std::size_t>(c.topk);
    node = node_of;
    int num_nodes = 0;
    for (int n : node) num_nodes = std::max(num_nodes, n + 1);
    nodes.assign(num_nodes, {});
    index.assign(P, 0);
    for (std::size_t p = 0; p < P; ++p) {
      index[p] = static_cast<int>(nodes[node[p]].size());
      nodes[node[p]].push_back(static_cast<int>(p));
    }
    has_experts.assign(num_nodes, 0);
    for (std::size_t p = 0; p < P; ++p) has_experts[node[p]] |= map.count(static_cast<int>(p)) > 0 ? 1 : 0;
    for (const auto& r : nodes) N = std::max(N, r.size());
    relays = c.combine == Combine::per_node && num_nodes > 1;
    slots.assign(P, {});
    if (relays) {
      for (std::size_t s = 0; s < P; ++s) {
        for (int b = 0; b < num_nodes; ++b) {
          if (b != node[s] && has_experts[b]) slots[relay(static_cast<int>(s), b)].push_back(static_cast<int>(s));
        }
      }
      for (const auto& v : slots) Q = std::max(Q, v.size());
    }
    tok = static_cast<std::size_t>(c.hidden) * element_size(c.dtype) + (c.dtype == DType::e4m3 ? 4 : 0);
    tok_slot = std::max<std::size_t>(tok, 4);  // a record's token, or its row in the source's tbuf (uint32)
    tstride = token_stride(c);
    rec_o = up16(entries_at(tok_slot) + sizeof(DdEntry) * std::min(k, L));
    rec_i = up16(entries_at(tok_slot) + sizeof(DdEntry) * std::min(k, L * N));
    region_o = kHeader + M * rec_o;
    region_i = Q ? kHeader + M * rec_i : 0;
    const bool r_f32 = c.float_partials || output_dtype(c.dtype) == DType::f32;
    rb = static_cast<std::size_t>(c.hidden) * (r_f32 ? 4 : 2);
    src_rows = M * std::min(k, P);
    cin_rows = M * std::min(k, N);
    D = 0;
    I = D + S * P;
    C = I + S * Q;
    Ps = C + S * P;
    R = Ps + S * Q * N;
    signals = R + P;
  }
  /// The relay of source s on node b (moe.hpp, "Combine modes").
  int relay(int s, int b) const { return nodes[b][index[s] % nodes[b].size()]; }
  /// s's slot at its relay on node b.
  std::size_t slot(int s, int b) const {
    const auto& v = slots[relay(s, b)];
    return static_cast<std::size_t>(std::find(v.begin(), v.end(), s) - v.begin());
  }
  std::size_t dbuf_bytes() const { return S * P * region_o; }
  std::size_t tbuf_bytes() const { return S * M * tstride; }
  std::size_t ibuf_bytes() const { return S * Q * region_i; }
  std::size_t rbuf_rows() const { return S * (src_rows + Q * cin_rows); }
  std::size_t heap() const {
    return up64(dbuf_bytes()) + up64(std::max<std::size_t>(tbuf_bytes(), 1)) + up64(ibuf_bytes()) +
           up64(rbuf_rows() * rb) + up64(signals * 8) + 4096;
  }
};

inline void notify(Context& ctx, std::uint64_t* sig, std::uint64_t value, int pe) {
  if (ctx.atomics_through_mpi()) {
    ctx.signal_op(sig, value, SignalOp::set, pe);
  } else {
    ctx.put_signal(nullptr, nullptr, 0, sig, value, SignalOp::set, pe);
  }
}

inline std::vector<int> nodes_of(const Topology& t) {
  std::vector<int> v(t.size());
  for (int p = 0; p < t.size(); ++p) v[p] = t.node_of(p);
  return v;
}

}  // namespace dedup

inline std::size_t dedup_heap_bytes(const Config& c, const std::vector<int>& node_of, unsigned run_ahead) {
  return dedup::Shape(c, node_of, run_ahead).heap();
}
inline std::size_t dedup_heap_bytes(const Config& c, const Topology& t, unsigned run_ahead) {
  return dedup_heap_bytes(c, dedup::nodes_of(t), run_ahead);
}

struct Layer::Dedup {
  using Shape = dedup::Shape;
  Layer& ly;
  Context& ctx;
  Shape g;
  int me = 0;
  bool r_f32 = false;
  Symmetric<std::byte> dbuf, tbuf, ibuf, rbuf;
  Symmetric<std::uint64_t> sig;
  std::vector<std::uint64_t> want, have;  // per signal: value awaited (kSignalIgnored: none), value seen
  std::vector<int> writers;               // per signal: its writer, for timeout reports
  std::vector<int> schedule;
  std::vector<int> order;         // ranks by (node, rank): the reduction order
  std::vector<int> my_writers;    // ranks that write into our dbuf (our releases go to them)
  std::vector<int> local_owners;  // ranks of our node with experts, ascending (relay targets)
  bool ucx = false;
  // Owner releases (as per_expert): calls 0 .. released-1 released; received[set] waits for older calls.
  std::uint64_t released = 0;
  std::vector<std::uint8_t> received;
  // Relay work per (set, slot).
  struct Slot {
    std::uint64_t call = 0;               // the call this (set, slot) serves now
    int phase = 0;                        // 0 inbox awaited, 1 forwarding, 2 partial rows awaited
    std::size_t n = 0;                    // inbox records
    std::uint64_t reply = 0;              // byte offset of the node rows in the source's rbuf
    std::vector<std::uint8_t> forwarded;  // [local_owners]
    std::vector<std::size_t> count;       // [local_owners] records forwarded to each owner
    std::vector<std::size_t> base;        // [local_owners] first cin row of each owner
    std::vector<std::uint32_t> rmap_end;  // [n] end of record j's rows in rmap
    std::vector<std::uint32_t> rmap;      // cin rows of each record, owners ascending
  };
  std::vector<Slot> slots;                                 // [S x Q]
  std::vector<std::uint64_t> slot_released;                // [Q] calls released to the slot's source
  std::vector<std::uint8_t> slot_fwd;                      // [S x Q] done, release not yet sent (in call order)
  std::map<std::uint64_t, std::vector<std::byte>> stages;  // staging copies for the network routes
  std::size_t hidden = 0;

  Dedup(Layer& layer, Context& c) : ly(layer), ctx(c), g(layer.config_, layer.node_, c.options().run_ahead) {
    me = ly.rank_;
    r_f32 = ly.partial_f32();
    const std::size_t need = g.heap();
    ly.check_heap(need);
    dbuf = ctx.alloc<std::byte>(g.dbuf_bytes());
    tbuf = ctx.alloc<std::byte>(std::max<std::size_t>(g.tbuf_bytes(), 1));
    ibuf = ctx.alloc<std::byte>(std::max<std::size_t>(g.ibuf_bytes(), 1));
    rbuf = ctx.alloc<std::byte>(g.rbuf_rows() * g.rb);
    sig = ctx.alloc_signals(g.signals);
    want.assign(g.signals, kSignalIgnored);
    have.assign(g.signals, 0);
    writers.assign(g.signals, -1);
    const int P = static_cast<int>(g.P);
    const int my_node = g.node[me];
    for (std::size_t z = 0; z < g.S; ++z) {
      for (int s = 0; s < P; ++s) {
        writers[g.D + z * g.P + s] = direct(s, me) ? s : g.relay(s, my_node);
        writers[g.C + z * g.P + s] = s;
      }
      for (std::size_t q = 0; q < g.slots[me].size(); ++q) {
        writers[g.I + z * g.Q + q] = g.slots[me][q];
        for (std::size_t u = 0; u < g.nodes[my_node].size(); ++u) {
          writers[g.Ps + (z * g.Q + q) * g.N + u] = g.nodes[my_node][u];
        }
      }
    }
    for (int p = 0; p < P; ++p) writers[g.R + p] = p;
    schedule = ubep::schedule(ctx.topology(), me, ctx.options().schedule);
    order.resize(P);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return g.node[a] < g.node[b]; });
    for (int p = 0; p < P; ++p) {
      if (direct(p, me)) my_writers.push_back(p);
      ucx = ucx || ctx.route(p) == Route::ucx;
    }
    for (int p : g.nodes[my_node]) {
      if (ly.map_.count(p) > 0) local_owners.push_back(p);
    }
    received.assign(g.S, 0);
    slots.resize(g.S * g.Q);
    for (std::size_t z = 0; z < g.S; ++z) {
      for (std::size_t q = 0; q < g.Q; ++q) slots[z * g.Q + q].call = z;
    }
    slot_released.assign(g.Q, 0);
    slot_fwd.assign(g.S * g.Q, 0);
    hidden = static_cast<std::size_t>(ly.config_.hidden);
  }

  /// Whether source s writes straight to owner x (else through s's relay on x's node).
  bool direct(int s, int x) const { return !g.relays || g.node[s] == g.node[x]; }
  /// Whether owner x gathers source s's tokens from s's tbuf (s writes x's chunk itself, over load/store;
  /// routes are symmetric, so both sides agree).
  bool gathers(int s, int x) const {
    return direct(s, x) && ly.map_.count(x) > 0 && !dedup::packed(ctx.route(s == me ? x : s));
  }
  std::size_t my_slots() const { return g.slots[me].size(); }

  /// True once signal i was seen at `value` or more; else arms it for the next wait.
  bool ready(std::size_t i, std::uint64_t value) {
    if (have[i] >= value) return true;
    want[i] = std::min(want[i], value);
    return false;
  }

  /// Runs the relay work and waits for signals until pred() holds.
  void serve(const std::function<bool()>& pred, const char* what) {
    for (;;) {
      while (relay_work()) {
      }
      if (pred()) return;
      std::vector<std::size_t> seen;
      try {
        seen = ctx.wait_until_some({sig.data(), g.signals}, Cmp::ge, want, {.writers = writers, .what = what});
      } catch (const Error& e) {
        if (e.code() != Errc::timeout) throw;
        throw Error(Errc::timeout, std::string(e.what()) + "; meanwhile " + awaited());
      }
      for (std::size_t i : seen) {
        have[i] = want[i];
        want[i] = kSignalIgnored;
      }
    }
  }

  /// Relay work without waiting: each armed signal is tested once (Context::test), and what became
  /// ready runs, until nothing moves.
  void progress() {
    for (;;) {
      bool moved = relay_work();
      for (std::size_t i = 0; i < g.signals; ++i) {
        if (want[i] == kSignalIgnored || !ctx.test(&sig[i], Cmp::ge, want[i])) continue;
        have[i] = want[i];
        want[i] = kSignalIgnored;
        moved = true;
      }
      if (!moved) break;
    }
    ctx.progress();
  }

  /// What the armed signals stand for, naming the source rank behind each relay (for timeout reports).
  std::string awaited() const {
    std::string out = "moe::Layer (" + std::string(to_string(ly.config_.combine)) + ") awaited:";
    std::size_t listed = 0, more = 0;
    const int my_node = g.node[me];
    for (std::size_t i = 0; i < g.signals; ++i) {
      if (want[i] == kSignalIgnored) continue;
      if (listed == 12) {
        ++more;
        continue;
      }
      ++listed;
      std::string w;
      if (i < g.I) {
        const int s = static_cast<int>((i - g.D) % g.P);
        w = "the tokens of rank " + std::to_string(s);
        if (writers[i] != s) w += " (through its relay, rank " + std::to_string(writers[i]) + ")";
      } else if (i < g.C) {
        w = "the tokens of rank " + std::to_string(writers[i]) + " to relay";
      } else if (i < g.Ps) {
        w = "the outputs from rank " + std::to_string(writers[i]);
      } else if (i < g.R) {
        const std::size_t q = ((i - g.Ps) / g.N) % g.Q;
        w = "the outputs of rank " + std::to_string(g.nodes[my_node][(i - g.Ps) % g.N]) + " for the tokens of rank " +
            std::to_string(g.slots[me][q]) + " (relayed)";
      } else {
        w = "the release of its buffers by rank " + std::to_string(writers[i]);
      }
      out += (listed > 1 ? "; " : " ") + w + " (call " + std::to_string((want[i] >> 32) - 1) + ")";
      if (i >= g.R) out.erase(out.rfind(" (call"));  // releases count calls, they carry no call tag
    }
    if (more) out += "; and " + std::to_string(more) + " more";
    return out;
  }

  /// A staging copy for a message on a network route, reused once UCX is done with its last send.
  std::byte* stage(std::uint64_t key, std::size_t bytes, int pe) {
    std::vector<std::byte>& v = stages[key];
    if (!v.empty() && ctx.route(pe) == Route::ucx) ctx.flush_local(pe);
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }

  /// Writes a region of `bytes` on pe: straight into pe's copy on a load/store route (mapped here through
  /// ctx.ptr, one range check for the region), into a staging copy sent as one put_signal_nbi on a network
  /// route. Either way `st` is where the region's bytes go.
  struct Out {
    Dedup& d;
    int pe;
    std::byte* remote;
    bool pk;
    std::byte* st = nullptr;
    std::size_t extent = 0;
    Out(Dedup& dd, int p, std::byte* r, std::uint64_t key, std::size_t bytes)
        : d(dd), pe(p), remote(r), pk(dedup::packed(dd.ctx.route(p))) {
      if (pk) {
        st = d.stage(key, bytes, p);
      } else if (bytes) {
        st = dd.ctx.ptr(r, bytes, p);
      }
    }
    void write(std::size_t off, const void* src, std::size_t n) {
      if (n == 0) return;
      std::memcpy(st + off, src, n);
      extent = std::max(extent, off + n);
    }
    /// Where a row at `off` can be computed in place.
    std::byte* direct(std::size_t off, std::size_t n) {
      extent = std::max(extent, off + n);
      return st + off;
    }
    void finish(std::size_t sig_index, std::uint64_t value) {
      std::uint64_t* s = &d.sig[sig_index];
      if (pk) {
        d.ctx.put_signal_nbi(remote, st, extent, s, value, SignalOp::set, pe);
      } else {
        dedup::notify(d.ctx, s, value, pe);
      }
    }
  };
  static std::uint64_t key(std::uint64_t kind, std::uint64_t set, std::uint64_t idx) {
    return (kind << 56) | (set << 40) | idx;
  }

  // ---- relay --------------------------------------------------------------------------------------------
  /// Advances every (set, slot); true if anything moved.
  bool relay_work() {
    bool moved = false;
    for (std::size_t z = 0; z < g.S; ++z) {
      for (std::size_t q = 0; q < my_slots(); ++q) moved = slot_step(z, q) || moved;
    }
    if (moved) ctx.progress();
    return moved;
  }

  bool slot_step(std::size_t z, std::size_t q) {
    Slot& sl = slots[z * g.Q + q];
    const int src = g.slots[me][q];
    const std::size_t U = local_owners.size();
    std::byte* inbox = ibuf.data() + (z * g.Q + q) * g.region_i;
    const std::uint64_t c = sl.call;
    bool moved = false;
    if (sl.phase == 0) {
      if (!ready(g.I + z * g.Q + q, dedup::tag(c))) return false;
      const auto* h = reinterpret_cast<const std::uint64_t*>(inbox);
      protocol(wire::check_inbox_header(h, g.M, g.rbuf_rows() * g.rb, g.rb), "the inbox", src, c);
      sl.n = h[0];
      sl.reply = h[1];
      sl.forwarded.assign(U, 0);
      sl.count.assign(U, 0);
      sl.base.assign(U, 0);
      sl.rmap_end.assign(sl.n, 0);
      sl.rmap.clear();
      // Count each owner's records, then number its rows: owner u's rows follow those of owners before it.
      for (std::size_t j = 0; j < sl.n; ++j) {
        for_owners(inbox + dedup::kHeader + j * g.rec_i, [&](std::size_t u) { ++sl.count[u]; });
      }
      for (std::size_t u = 1; u < U; ++u) sl.base[u] = sl.base[u - 1] + sl.count[u - 1];
      std::vector<std::size_t> next(sl.base);
      for (std::size_t j = 0; j < sl.n; ++j) {
        for_owners(inbox + dedup::kHeader + j * g.rec_i,
                   [&](std::size_t u) { sl.rmap.push_back(static_cast<std::uint32_t>(next[u]++)); });
        sl.rmap_end[j] = static_cast<std::uint32_t>(sl.rmap.size());
      }
      sl.phase = 1;
      moved = true;
    }
    if (sl.phase == 1) {
      std::size_t done = 0;
      for (std::size_t u = 0; u < U; ++u) {
        if (!sl.forwarded[u]) {
          const int x = local_owners[u];
          if (c >= g.S && !ready(g.R + x, c - g.S + 1)) continue;
          forward(z, q, src, u, sl, inbox);
          sl.forwarded[u] = 1;
          moved = true;
        }
        ++done;
      }
      if (done < U) return moved;
      sl.phase = 2;
      moved = true;
    }
    if (sl.phase == 2) {
      bool all = true;
      for (std::size_t u = 0; u < U; ++u) {
        if (sl.count[u] && !ready(g.Ps + (z * g.Q + q) * g.N + g.index[local_owners[u]], dedup::tag(c))) all = false;
      }
      if (!all) return moved;
      // Every owner that got records has sent its partial rows, so it is done with the inbox (owners on
      // load/store gather from it): release the inbox to its source, in call order (a call done before an
      // older one waits for it; the flag of set released % S is that call's: its inbox came after the
      // release of the call S before it). By moe.hpp's run-ahead the source waits for this release only
      // after its combine_recv of this call, which needs the node rows below anyway.
      slot_fwd[z * g.Q + q] = 1;
      const std::uint64_t was = slot_released[q];
      while (slot_fwd[(slot_released[q] % g.S) * g.Q + q]) slot_fwd[(slot_released[q]++ % g.S) * g.Q + q] = 0;
      if (slot_released[q] != was) dedup::notify(ctx, &sig[g.R + me], slot_released[q], src);
      if (sl.n) send_node_rows(z, q, src, sl);
      sl.call += g.S;
      sl.phase = 0;
      return true;
    }
    return moved;
  }

  /// Calls f(u) for each local owner u (index into local_owners) that record `rec` of an inbox names.
  template <class F>
  void for_owners(const std::byte* rec, F&& f) const {
    std::uint32_t m;
    std::memcpy(&m, rec + g.tok_slot, 4);
    if (m > std::min(g.k, g.L * g.N)) {
      protocol(wire::check_record_count(m, std::min(g.k, g.L * g.N)), "an inbox record", -1, 0);
    }
    const auto* e = reinterpret_cast<const DdEntry*>(rec + dedup::entries_at(g.tok_slot));
    for (std::size_t u = 0; u < local_owners.size(); ++u) {
      for (std::uint32_t i = 0; i < m; ++i) {
        if (e[i].owner == local_owners[u]) {
          f(u);
          break;
        }
      }
    }
  }

  /// Forwards slot q's inbox of set z to local owner u: the records that name u, with u's entries only.
  void forward(std::size_t z, std::size_t q, int src, std::size_t u, const Slot& sl, const std::byte* inbox) {
    const int x = local_owners[u];
    const std::size_t n = sl.count[u];
    std::byte* region = dbuf.data() + (z * g.P + src) * g.region_o;
    Out out(*this, x, region, key(2, z, q * g.N + u), dedup::kHeader + n * g.rec_o);
    const std::uint64_t header[4] = {
        n, static_cast<std::uint64_t>(me),
        (z * (g.src_rows + g.Q * g.cin_rows) + g.src_rows + q * g.cin_rows + sl.base[u]) * g.rb,
        g.Ps + (z * g.Q + q) * g.N + g.index[x]};
    out.write(0, header, sizeof header);
    const bool rows_only = !dedup::packed(ctx.route(x));
    std::size_t j2 = 0;
    std::vector<DdEntry> mine;
    for (std::size_t j = 0; j < sl.n; ++j) {
      const std::byte* rec = inbox + dedup::kHeader + j * g.rec_i;
      std::uint32_t m;
      std::memcpy(&m, rec + g.tok_slot, 4);
      const auto* e = reinterpret_cast<const DdEntry*>(rec + dedup::entries_at(g.tok_slot));
      mine.clear();
      for (std::uint32_t i = 0; i < m; ++i) {
        if (e[i].owner == x) mine.push_back(e[i]);
      }
      if (mine.empty()) continue;
      const std::size_t at = dedup::kHeader + j2 * g.rec_o;
      const std::uint32_t mm = static_cast<std::uint32_t>(mine.size());
      if (rows_only) {  // x gathers the token from our inbox: its record's index there suffices
        const std::uint32_t row = static_cast<std::uint32_t>(j);
        out.write(at, &row, 4);
      } else {
        out.write(at, rec, g.tok);
      }
      out.write(at + g.tok_slot, &mm, 4);
      out.write(at + dedup::entries_at(g.tok_slot), mine.data(), mine.size() * sizeof(DdEntry));
      ly.count(true, x, g.tok);
      ++j2;
    }
    out.finish(g.D + z * g.P + src, dedup::tag(sl.call) | n);
  }

  /// Sums the owners' partial rows of each inbox record (owners ascending) and sends the node rows back.
  void send_node_rows(std::size_t z, std::size_t q, int src, const Slot& sl) {
    const std::byte* cin = rbuf.data() + (z * (g.src_rows + g.Q * g.cin_rows) + g.src_rows + q * g.cin_rows) * g.rb;
    Out out(*this, src, rbuf.data() + sl.reply, key(3, z, q), sl.n * g.rb);
    std::vector<const std::byte*> rows;
    for (std::size_t j = 0; j < sl.n; ++j) {
      rows.clear();
      for (std::uint32_t i = j ? sl.rmap_end[j - 1] : 0; i < sl.rmap_end[j]; ++i)
        rows.push_back(cin + sl.rmap[i] * g.rb);
      node_row(rows, r_f32, hidden, out.direct(j * g.rb, g.rb));
    }
    ly.count(false, src, sl.n * g.rb);
    out.finish(g.C + z * g.P + me, dedup::tag(sl.call) | 1);
  }

  [[noreturn]] void internal(const std::string& what) const {
    throw Error(Errc::internal,
                "ubep: rank " + std::to_string(me) + ": moe::Layer (" + to_string(ly.config_.combine) + "): " + what);
  }
  /// A peer's header or record failed its check (moe/wire.hpp): Errc::protocol naming the peer, call and field.
  void protocol(const std::string& why, const char* what, int from, std::uint64_t call) const {
    if (why.empty()) return;
    throw Error(Errc::protocol, "ubep: rank " + std::to_string(me) + ": moe::Layer (" + to_string(ly.config_.combine) +
                                    "): " + what + " from rank " + std::to_string(from) + " in call " +
                                    std::to_string(call) + " breaks the protocol: " + why);
  }

  // ---- source -------------------------------------------------------------------------------------------
  /// The target of an expert owned by o: o itself, or o's node's relay.
  int target(int o) const { return direct(me, o) ? o : g.relay(me, g.node[o]); }

  void send(HandleState& h, std::span<const std::byte> tokens, std::span<const float> scales) {
    const std::size_t P = g.P, k = g.k, n = static_cast<std::size_t>(h.n), z = static_cast<std::size_t>(h.set);
    const std::size_t payload = static_cast<std::size_t>(ly.config_.hidden) * element_size(ly.config_.dtype);
    h.dd_tokens.assign(P, {});
    h.dd_m.assign(P, {});
    h.dd_e.assign(P, {});
    h.dd_row0.assign(P, 0);
    h.dd_slot.assign(n * P, -1);
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t a = 0; a < k; ++a) {
        const int e = h.idx[t * k + a], o = ly.map_.owner(e);
        const int r = target(o);
        if (h.dd_tokens[r].empty() || h.dd_tokens[r].back() != static_cast<int>(t)) {
          h.dd_tokens[r].push_back(static_cast<int>(t));
          h.dd_m[r].push_back(static_cast<std::uint32_t>(h.dd_e[r].size()));
        }
        h.dd_e[r].push_back({o, e - ly.map_.first(o), h.weights[t * k + a]});
      }
    }
    std::size_t rows = 0;
    for (std::size_t r = 0; r < P; ++r) {
      h.dd_row0[r] = rows;
      for (std::size_t j = 0; j < h.dd_tokens[r].size(); ++j) {
        h.dd_slot[static_cast<std::size_t>(h.dd_tokens[r][j]) * P + r] = static_cast<int>(rows + j);
      }
      rows += h.dd_tokens[r].size();
    }
    if (rows > g.src_rows) internal("call " + std::to_string(h.call) + " needs " + std::to_string(rows) + " rows");
    const std::uint64_t c = h.call;
    const std::string what = "moe back-pressure (run-ahead), call " + std::to_string(c);
    // Owners that gather from our tbuf set: all of them must have released call c - S before it is restaged.
    bool staged = false;
    for (int r : schedule) {
      if (!gathers(me, r)) continue;
      if (c >= g.S) serve([&] { return ready(g.R + r, c - g.S + 1); }, what.c_str());
      staged = true;
    }
    if (staged) {
      std::vector<int> all(n);
      std::iota(all.begin(), all.end(), 0);
      ly.pack(all, tbuf.data() + z * g.M * g.tstride, tokens, scales);
    }
    for (int r : schedule) {
      const bool relay = !direct(me, r);
      if (relay ? !(g.has_experts[g.node[r]] && g.relay(me, g.node[r]) == r) : ly.map_.count(r) == 0) continue;
      if (c >= g.S) {
        serve([&] { return ready(g.R + r, c - g.S + 1); }, what.c_str());
      }
      const auto& toks = h.dd_tokens[r];
      const std::size_t rec = relay ? g.rec_i : g.rec_o;
      std::byte* region;
      std::size_t signal;
      // Where the rows come back: byte offset of the target's rows in our rbuf. An owner's header also
      // names the reply rank and signal (us, C[set][owner]); an inbox's has only the offset (the relay
      // replies to the inbox's source, on C[set][relay]).
      const std::uint64_t reply = (z * (g.src_rows + g.Q * g.cin_rows) + h.dd_row0[r]) * g.rb;
      std::uint64_t header[4] = {toks.size(), static_cast<std::uint64_t>(me), reply, g.C + z * P + r};
      if (relay) {
        const std::size_t q = g.slot(me, g.node[r]);
        region = ibuf.data() + (z * g.Q + q) * g.region_i;
        signal = g.I + z * g.Q + q;
        header[1] = reply;  // the inbox layout: count, reply offset
        header[2] = header[3] = 0;
      } else {
        region = dbuf.data() + (z * P + me) * g.region_o;
        signal = g.D + z * P + me;
      }
      Out out(*this, r, region, key(0, z, r), dedup::kHeader + toks.size() * rec);
      out.write(0, header, sizeof header);
      const bool rows_only = gathers(me, r);  // r gathers the tokens from our tbuf: their rows suffice
      for (std::size_t j = 0; j < toks.size(); ++j) {
        const std::size_t t = static_cast<std::size_t>(toks[j]);
        const std::size_t at = dedup::kHeader + j * rec;
        const std::uint32_t e0 = h.dd_m[r][j];
        const std::uint32_t e1 = j + 1 < toks.size() ? h.dd_m[r][j + 1] : static_cast<std::uint32_t>(h.dd_e[r].size());
        const std::uint32_t m = e1 - e0;
        if (rows_only) {
          const std::uint32_t row = static_cast<std::uint32_t>(t);
          out.write(at, &row, 4);
        } else {
          out.write(at, tokens.data() + t * payload, payload);
          if (!scales.empty()) out.write(at + payload, &scales[t], 4);
        }
        out.write(at + g.tok_slot, &m, 4);
        out.write(at + dedup::entries_at(g.tok_slot), h.dd_e[r].data() + e0, m * sizeof(DdEntry));
      }
      ly.count(true, r, toks.size() * g.tok);
      out.finish(signal, dedup::tag(c) | toks.size());
    }
    ctx.progress();
  }

  // ---- owner --------------------------------------------------------------------------------------------
  std::optional<int> next_expert(HandleState& s) {
    const int local = ly.local_experts();
    if (s.num_returned == local) return std::nullopt;
    if (!s.dd_parsed) receive(s);
    for (int le = 0; le < local; ++le) {
      if (s.ready[le] && !s.returned[le]) {
        s.returned[le] = 1;
        ++s.num_returned;
        return le;
      }
    }
    // Regroup the next expert and hand it out at once (the copy of the next overlaps the caller's work).
    for (int le = 0; le < local; ++le) {
      if (s.ready[le]) continue;
      regroup(s, le);
      if (s.num_ready == local) release(s);
      s.returned[le] = 1;
      ++s.num_returned;
      return le;
    }
    return std::nullopt;
  }

  /// Waits for every source's chunk of this call and copies its bookkeeping out of the buffers.
  void receive(HandleState& s) {
    const std::size_t P = g.P, z = static_cast<std::size_t>(s.set);
    const std::string what = "moe dispatch of call " + std::to_string(s.call);
    serve(
        [&] {
          bool all = true;
          for (std::size_t src = 0; src < P; ++src) all = ready(g.D + z * P + src, dedup::tag(s.call)) && all;
          return all;
        },
        what.c_str());
    const int local = ly.local_experts();
    s.dd_n.assign(P, 0);
    s.dd_reply.assign(3 * P, 0);
    s.dd_rec.assign(P + 1, 0);
    s.dd_ent.assign(1, 0);
    s.dd_le.clear();
    s.dd_row.clear();
    s.dd_w.clear();
    s.dd_src.assign(local, {});
    s.dd_by_le.assign(local, {});
    s.dd_rec_of.clear();
    s.dd_src_of.clear();
    s.dd_pending.clear();
    std::vector<int> cursor(local, 0);
    for (std::size_t src = 0; src < P; ++src) {
      const std::byte* region = dbuf.data() + (z * P + src) * g.region_o;
      const auto* h = reinterpret_cast<const std::uint64_t*>(region);
      // Records that carry rows instead of tokens (mapped here, one range check): those of a source that
      // gathers (rows of its staged tokens), and those its relay forwards over load/store (rows of the inbox).
      const int from = static_cast<int>(src);
      const int writer = direct(from, me) ? from : g.relay(from, g.node[me]);
      const std::byte* staged = nullptr;
      std::size_t stride = 0;
      if (gathers(from, me)) {
        stride = g.tstride;
        staged = ctx.ptr(tbuf.data() + z * g.M * g.tstride, g.M * g.tstride, from);
      } else if (writer != from && !dedup::packed(ctx.route(writer))) {
        stride = g.rec_i;
        const std::byte* inbox = ibuf.data() + (z * g.Q + g.slot(from, g.node[me])) * g.region_i;
        if (const std::byte* p = ctx.ptr(inbox, g.region_i, writer)) staged = p + dedup::kHeader;
      }
      if (stride && !staged) {
        internal("the tokens of rank " + std::to_string(src) + " are not mapped from rank " + std::to_string(writer) +
                 " on a load/store route");
      }
      s.dd_n[src] = h[0];
      s.dd_reply[3 * src] = h[1];
      s.dd_reply[3 * src + 1] = h[2];
      s.dd_reply[3 * src + 2] = h[3];
      protocol(wire::check_chunk_header(h, g.M, P, g.signals, g.rbuf_rows() * g.rb, g.rb), "the chunk",
               static_cast<int>(src), s.call);
      for (std::size_t j = 0; j < h[0]; ++j) {
        const std::byte* rec = region + dedup::kHeader + j * g.rec_o;
        std::uint32_t m;
        std::memcpy(&m, rec + g.tok_slot, 4);
        const auto* e = reinterpret_cast<const DdEntry*>(rec + dedup::entries_at(g.tok_slot));
        protocol(wire::check_record_count(m, std::min(g.k, g.L)), "a record", static_cast<int>(src), s.call);
        protocol(wire::check_record_entries(e, m, me, local), "a record", static_cast<int>(src), s.call);
        const std::byte* token = rec;
        if (staged) {
          std::uint32_t row;
          std::memcpy(&row, rec, 4);
          protocol(wire::check_gathered_rows(&row, 1, g.M), "a record", static_cast<int>(src), s.call);
          token = staged + static_cast<std::size_t>(row) * stride;
        }
        for (std::uint32_t i = 0; i < m; ++i) {
          s.dd_by_le[e[i].le].push_back(static_cast<int>(s.dd_le.size()));
          s.dd_rec_of.push_back(static_cast<int>(s.dd_src_of.size()));
          s.dd_le.push_back(e[i].le);
          s.dd_w.push_back(e[i].w);
          s.dd_row.push_back(cursor[e[i].le]++);
          s.dd_src[e[i].le].push_back(token);
          ++s.recv_counts[static_cast<std::size_t>(e[i].le) * P + src];
        }
        s.dd_ent.push_back(s.dd_le.size());
        s.dd_src_of.push_back(static_cast<int>(src));
        s.dd_pending.push_back(static_cast<int>(m));
      }
      s.dd_rec[src + 1] = s.dd_rec[src] + h[0];
    }
    s.dd_parsed = true;
    s.dd_out.resize(local);
  }

  void regroup(HandleState& s, int le) {
    const std::size_t payload = static_cast<std::size_t>(ly.config_.hidden) * element_size(ly.config_.dtype);
    const auto& recs = s.dd_src[le];
    std::vector<std::byte>& data = s.expert_data[le];
    ly.reuse(data, recs.size() * payload);
    std::vector<float>& sc = s.expert_scales[le];
    const bool scaled = ly.config_.dtype == DType::e4m3;
    sc.resize(scaled ? recs.size() : 0);
    for (std::size_t i = 0; i < recs.size(); ++i) {
      std::memcpy(data.data() + i * payload, recs[i], payload);
      if (scaled) std::memcpy(&sc[i], recs[i] + payload, 4);
    }
    s.ready[le] = 1;
    ++s.num_ready;
  }

  /// Everything of this call is out of our chunks: release it to the writers, in call order.
  void release(HandleState& s) {
    if (s.released) return;
    s.released = true;
    received[s.set] = 1;
    const std::uint64_t was = released;
    while (released < ly.calls_ && received[released % g.S]) received[released++ % g.S] = 0;
    if (released == was) return;
    for (int w : my_writers) dedup::notify(ctx, &sig[g.R + me], released, w);
    ctx.progress();
  }

  void dispatch_recv(HandleState& s) {
    std::vector<std::uint8_t> returned = s.returned;
    const int was = s.num_returned;
    for (int le = 0; le < ly.local_experts(); ++le) {
      if (!s.dd_parsed) receive(s);
      if (!s.ready[le]) regroup(s, le);
    }
    if (s.num_ready == ly.local_experts() && ly.local_experts() > 0) release(s);
    s.returned = std::move(returned);
    s.num_returned = was;
  }

  /// Expert `local`'s outputs: each record whose last expert this is gets its partial row now (its experts
  /// in k order: this expert's row from `outputs`, the others' from the copies kept for it); the rows of
  /// records still waiting for another expert are copied. The last local expert sends the partial rows.
  void combine_send(HandleState& s, int local, std::span<const std::byte> outputs) {
    const std::size_t ob = ly.out_token_bytes_, z = static_cast<std::size_t>(s.set);
    const bool y_f32 = output_dtype(ly.config_.dtype) == DType::f32;
    if (s.num_combined == 0) {
      // Staging for the partial rows to network-route reply ranks (the rows are computed into it).
      s.dd_stage.assign(g.P, nullptr);
      for (std::size_t src = 0; src < g.P; ++src) {
        const int to = static_cast<int>(s.dd_reply[3 * src]);
        if (s.dd_n[src] && dedup::packed(ctx.route(to)))
          s.dd_stage[src] = stage(key(1, z, src), s.dd_n[src] * g.rb, to);
      }
    }
    // The outputs are this expert's expert_outputs rows: they stay until combine_recv, so the rows of records
    // still waiting for another expert are read there later instead of copied.
    const bool in_place = s.out_taken[local] && outputs.data() == s.out_rows[local].data();
    s.out_in_place[local] = in_place ? 1 : 0;
    const std::vector<int>& rows_of = s.dd_by_le[local];
    std::vector<std::byte>* copy = nullptr;
    std::vector<float> w;
    std::vector<const std::byte*> y;
    for (std::size_t j = 0; j < rows_of.size(); ++j) {
      const int r = s.dd_rec_of[rows_of[j]];
      const std::byte* mine = outputs.data() + j * ob;
      if (--s.dd_pending[r] > 0) {
        if (in_place) continue;
        if (!copy) {
          copy = &s.dd_out[local];
          ly.reuse(*copy, outputs.size());
        }
        std::memcpy(copy->data() + j * ob, mine, ob);
        continue;
      }
      w.clear();
      y.clear();
      for (std::size_t i = s.dd_ent[r]; i < s.dd_ent[static_cast<std::size_t>(r) + 1]; ++i) {
        w.push_back(s.dd_w[i]);
        const int le = s.dd_le[i];
        const std::byte* kept = s.out_in_place[le] ? s.out_rows[le].data() : s.dd_out[le].data();
        y.push_back(le == local ? mine : kept + static_cast<std::size_t>(s.dd_row[i]) * ob);
      }
      const int src = s.dd_src_of[r];
      const std::size_t at = (static_cast<std::size_t>(r) - s.dd_rec[src]) * g.rb;
      if (std::byte* st = s.dd_stage[src]) {
        partial_row(w, y, y_f32, hidden, r_f32, st + at);
      } else {  // a load/store route: the row is computed straight into the source's buffer
        partial_row(w, y, y_f32, hidden, r_f32,
                    ctx.ptr(rbuf.data() + s.dd_reply[3 * src + 1] + at, g.rb, static_cast<int>(s.dd_reply[3 * src])));
      }
    }
    s.combined[local] = 1;
    if (++s.num_combined < ly.local_experts()) return;
    // The last local expert: every partial row is computed; one message or signal per reply.
    for (int src : schedule) {
      const std::size_t n = s.dd_n[src];
      if (n == 0) continue;
      const int to = static_cast<int>(s.dd_reply[3 * src]);
      std::uint64_t* signal = &sig[s.dd_reply[3 * src + 2]];
      if (std::byte* st = s.dd_stage[src]) {
        ctx.put_signal_nbi(rbuf.data() + s.dd_reply[3 * src + 1], st, n * g.rb, signal, dedup::tag(s.call) | 1,
                           SignalOp::set, to);
      } else {
        dedup::notify(ctx, signal, dedup::tag(s.call) | 1, to);
      }
      ly.count(false, to, n * g.rb);
    }
    ctx.progress();
  }

  // ---- source, combine ----------------------------------------------------------------------------------
  void combine_recv(HandleState& s, std::span<float> out) {
    const std::size_t P = g.P, z = static_cast<std::size_t>(s.set);
    const std::string what = "moe combine of call " + std::to_string(s.call);
    serve(
        [&] {
          bool all = true;
          for (std::size_t r = 0; r < P; ++r) {
            if (!s.dd_tokens[r].empty()) all = ready(g.C + z * P + r, dedup::tag(s.call)) && all;
          }
          // Our relay work of this call is done too (its sources wait for it).
          for (std::size_t q = 0; q < my_slots(); ++q) all = all && slots[z * g.Q + q].call > s.call;
          return all;
        },
        what.c_str());
    if (out.size() != static_cast<std::size_t>(s.n) * hidden) {
      throw Error(Errc::invalid_argument,
                  "ubep: rank " + std::to_string(me) + ": combine_recv: out has " + std::to_string(out.size()) +
                      " elements, expected n x hidden = " + std::to_string(static_cast<std::size_t>(s.n) * hidden));
    }
    const std::byte* rows = rbuf.data() + z * (g.src_rows + g.Q * g.cin_rows) * g.rb;
    std::vector<const std::byte*> ptrs;
    std::vector<NodeTerm> terms;
    const int my_node = g.node[me];
    for (int t = 0; t < s.n; ++t) {
      ptrs.clear();
      terms.clear();
      // Ranks in (node, rank) order; a relay's slot is its node's row, owners' slots are partial rows.
      std::size_t first = 0;
      int cur = -1;
      ptrs.reserve(P);  // the terms' spans point into ptrs: no reallocation
      const auto close = [&] {
        if (cur >= 0 && ptrs.size() > first) {
          terms.push_back(
              {nullptr, std::span<const std::byte* const>(ptrs.data() + first, ptrs.size() - first), cur != my_node});
        }
      };
      for (int r : order) {
        const int slot = s.dd_slot[static_cast<std::size_t>(t) * P + r];
        if (slot < 0) continue;
        if (!direct(me, r)) {
          close();
          cur = -1;
          first = ptrs.size();
          terms.push_back({rows + static_cast<std::size_t>(slot) * g.rb, {}, true});
          continue;
        }
        if (g.node[r] != cur) {
          close();
          cur = g.node[r];
          first = ptrs.size();
        }
        ptrs.push_back(rows + static_cast<std::size_t>(slot) * g.rb);
      }
      close();
      reduce_token(terms, r_f32, hidden, out.data() + static_cast<std::size_t>(t) * hidden);
    }
    if (ucx) {
      for (int p = 0; p < static_cast<int>(P); ++p) {
        if (ctx.route(p) == Route::ucx) ctx.flush_local(p);
      }
    }
    for (auto& v : s.dd_out) {
      if (v.capacity()) ly.pool_.push_back(std::move(v));
    }
  }

  std::size_t buffer_bytes() const {
    std::size_t b = g.heap();
    for (const auto& [k, v] : stages) b += v.size();
    return b;
  }
};

}  // namespace ubep::moe
