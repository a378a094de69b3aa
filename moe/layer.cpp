// ubep's dispatch/combine. Per buffer set (UBEP_RUN_AHEAD sets; call c uses set c % S), one region per
// (set, source) on every expert owner:
//   dbuf  [S][ranks] regions   on the expert's owner; source s writes region (set, s): a header of two
//                              words per local expert of the owner (token count, s's combine offset),
//                              then, over mpi and ucx, the tokens expert by expert; over load/store the
//                              tokens' rows in s's tbuf (uint32), expert by expert
//   tbuf  [S][max_tokens_per_rank] token rows: this rank's tokens of the call, staged once for the owners
//                              on load/store, which gather each expert's batch from them (a token then
//                              moves once to the stage and once per expert into a batch, instead of once
//                              per expert into the owner's region and again into the batch)
//   dsig  [S][max_local+1][ranks]  (c+1) << 32 | tokens, set by source s: over load/store one signal per
//                              local expert (row le) as soon as its tokens are in, so the owner can start
//                              that expert early; over mpi one signal (row max_local) after the region
//   cbuf  [S][M * topk] outputs on the token's source, written by the expert owners
//   csig  [S][ranks]           (c+1) << 32 | 1, set by owner d after the outputs of all its local experts
//   rel   [ranks]              c+1: owner d has consumed everything of calls 0..c from us (in call order,
//                              also when the caller received a later call first)
// Why one signal per peer over mpi: each signal and each flush there is an MPI call with a round trip over
// the network (docs/MULTINODE.md, "Benchmarks across nodes", has the numbers), while over load/store a
// signal is one store. On the mpi route the region goes out as one put from a staging copy, the outputs
// of each expert as one put per source from a staging copy, and there is one flush per peer per direction.
// Routes are symmetric (same node: load/store both ways), so the owner knows which row each source uses.
// No collective, no barrier: a source writes call c into owner d's set, or into its own tbuf set that d
// gathers from, only after d released call c-S (d releases a call after its last expert's gather).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "moe/dedup.hpp"
#include "moe/kernels.hpp"
#include "moe/layer_impl.hpp"
#include "moe/wire.hpp"
#include "ubep/topology.hpp"

namespace ubep::moe {

struct OneSidedImpl::PerExpert {
  Symmetric<std::byte> dbuf, cbuf, tbuf;
  Symmetric<std::uint64_t> dsig, csig, rel;
  std::vector<int> schedule;
  std::vector<int> peers;    // 0 .. ranks-1: the writer of csig entry i is rank i
  std::vector<int> writers;  // the writer of each dsig entry of a set: its column
  // Dispatch regions to the peers on a network route, packed: mpi one copy (flushed before send()
  // returns); ucx one copy per buffer set (sent non-blocking; a set's copy is reused S calls later,
  // after flush_local of each peer, by then long done).
  std::vector<std::byte> staging;
  std::size_t stage_bytes = 0;                   // one copy
  bool ucx = false;                              // some peer on the ucx route
  std::vector<std::vector<std::byte>> out_pool;  // combine staging buffers, reused across calls
  std::size_t region = 0;                        // bytes of one (set, source) region
  std::size_t header = 0;                        // bytes of its header
  std::size_t heap = 0;
  // Config::zero_copy: expert_outputs rows, per set `orows` rows ([local experts] in the order taken, each
  // source-ascending as the batch), and per (set, source, local expert) where that source's rows start:
  // otab [S][ranks][max_local], a row of obuf or kCopied (put into the source's cbuf). Sources on load/store
  // read both in place, after this rank's csig.
  Symmetric<std::byte> obuf;
  Symmetric<std::uint64_t> otab;
  std::size_t orows = 0;
  std::uint64_t released = 0;          // calls 0 .. released-1 are released to every source
  std::vector<std::uint8_t> received;  // [S]: the call on this set is received, its release waits for older ones
};

namespace {

/// Routes over a network (mpi, ucx): a source packs each peer's region into one message and one signal.
bool packed(Route r) { return r == Route::mpi || r == Route::ucx; }

/// Sets signal `sig` on pe to `value`, ordered after this rank's data to pe (all the layer needs).
/// Through MPI: signal_op, deferred and delivered behind one flush for every peer. Otherwise put_signal
/// without data: a store (load/store atomics) or one message (ucx); signal_op would also flush the data
/// still in flight to the other ucx peers, since it orders the signal after the puts to every peer.
void notify(Context& ctx, std::uint64_t* sig, std::uint64_t value, int pe) {
  if (ctx.atomics_through_mpi()) {
    ctx.signal_op(sig, value, SignalOp::set, pe);
  } else {
    ctx.put_signal(nullptr, nullptr, 0, sig, value, SignalOp::set, pe);
  }
}
constexpr std::uint64_t tag(std::uint64_t call) { return (call + 1) << 32; }
constexpr std::size_t up64(std::size_t b) { return (b + 63) / 64 * 64; }

constexpr std::uint64_t kCopied = ~std::uint64_t{0};

struct Geometry {
  std::size_t header, region;  // bytes
  std::size_t rows;            // token rows of one region
};
/// The (set, source) region: the header (count, offset per local expert), then at most
/// max_tokens_per_rank x min(topk, max_local) tokens (each token goes to an expert at most once).
Geometry geometry(const Config& c, const ExpertMap& map) {
  const std::size_t L = static_cast<std::size_t>(map.max_local());
  const std::size_t tokens = static_cast<std::size_t>(c.max_tokens_per_rank) * std::min<std::size_t>(c.topk, L);
  const std::size_t header = up64(2 * L * sizeof(std::uint64_t));
  const std::size_t region = up64(header + tokens * token_stride(c));
  return {header, region, (region - header) / token_stride(c)};
}
/// Config::zero_copy: the output rows of one set: every source may fill its region.
/// None under Memory::device, where expert_outputs is refused.
std::size_t zero_copy_rows(const Config& c, const Geometry& g, std::size_t ranks) {
  return c.zero_copy && c.memory == Memory::host ? ranks * g.rows : 0;
}
}  // namespace

std::size_t OneSidedImpl::heap_bytes(const Config& config, const Topology& t, unsigned run_ahead) {
  Config c = config;
  c.combine = resolve_combine(c.combine, t);
  if (c.combine == Combine::per_expert) return heap_bytes(c, t.size(), run_ahead);
  return dedup_heap_bytes(c, t, run_ahead);
}

std::size_t OneSidedImpl::heap_bytes(const Config& c, int ranks, unsigned run_ahead) {
  // One node: automatic is per_expert (resolve_combine).
  if (c.combine != Combine::per_expert && c.combine != Combine::automatic) {
    return dedup_heap_bytes(c, std::vector<int>(std::max(ranks, 1), 0), run_ahead);
  }
  const ExpertMap map{c.num_experts, ranks};
  const std::size_t P = ranks, S = run_ahead, M = c.max_tokens_per_rank;
  const Geometry g = geometry(c, map);
  // dbuf, cbuf, tbuf, dsig, csig, rel (each allocation rounded up to 64 bytes), and slack for the allocator.
  const std::size_t dsig = S * (static_cast<std::size_t>(map.max_local()) + 1) * P;
  const std::size_t zero_copy = zero_copy_rows(c, g, P)
                                    ? up64(S * zero_copy_rows(c, g, P) * output_stride(c)) +
                                          up64(S * P * static_cast<std::size_t>(map.max_local()) * 8)
                                    : 0;
  return S * P * g.region + up64(S * M * c.topk * output_stride(c)) + up64(S * M * token_stride(c)) + up64(dsig * 8) +
         up64(S * P * 8) + up64(P * 8) + zero_copy + 4096;
}

void OneSidedImpl::check_heap(std::size_t need) const {
  const std::size_t largest = ctx_.heap_free();
  if (need > largest) {
    // The advice, set exactly, must fit. The Context rounds UBEP_HEAP_SIZE up to 4 KiB, so more can be
    // free than was asked for; every byte outside the largest free block counts as taken; `need` holds
    // our five allocations wherever a free block starts (heap_bytes rounds each up to the 64-byte
    // alignment and adds 4 KiB). This assumes the largest free block is the one at the end of the heap,
    // which holds unless freed objects left a larger hole below a live one (heap_free() cannot tell).
    const std::size_t heap = std::max((ctx_.options().heap_size + 4095) / 4096 * 4096, largest);
    throw OutOfHeap("ubep: rank " + std::to_string(rank_) + ": moe::Layer: needs " + std::to_string(need) +
                    " bytes of symmetric heap, its largest free block has " + std::to_string(largest) + " of " +
                    std::to_string(heap) + " bytes; set UBEP_HEAP_SIZE to at least " +
                    std::to_string(heap - largest + need) + " (or lower max_tokens_per_rank or UBEP_RUN_AHEAD)");
  }
}

OneSidedImpl::OneSidedImpl(Context& ctx, const Config& cfg)
    : LayerImpl(ctx, cfg, "moe::Layer"), per_expert_(std::make_unique<PerExpert>()) {
  const Config& config = config_;  // Config::combine resolved
  if (config.combine != Combine::per_expert) {
    dedup_ = std::make_unique<Dedup>(*this, ctx);
    return;
  }
  const std::size_t S = ctx.options().run_ahead, P = size_;
  const std::size_t M = static_cast<std::size_t>(config.max_tokens_per_rank);
  const Geometry g = geometry(config, map_);
  per_expert_->region = g.region;
  per_expert_->header = g.header;
  const std::size_t need = heap_bytes(config, size_, ctx.options().run_ahead);
  check_heap(need);
  per_expert_->dbuf = ctx.alloc<std::byte>(S * P * g.region);
  per_expert_->cbuf = ctx.alloc<std::byte>(S * M * config.topk * out_token_bytes_);
  per_expert_->tbuf = ctx.alloc<std::byte>(S * M * token_bytes_);
  per_expert_->dsig = ctx.alloc_signals(S * (map_.max_local() + 1) * P);
  per_expert_->csig = ctx.alloc_signals(S * P);
  per_expert_->rel = ctx.alloc_signals(P);
  per_expert_->orows = zero_copy_rows(config, g, P);
  if (per_expert_->orows) {
    per_expert_->obuf = ctx.alloc<std::byte>(S * per_expert_->orows * out_token_bytes_);
    per_expert_->otab = ctx.alloc<std::uint64_t>(S * P * static_cast<std::size_t>(map_.max_local()));
  }
  per_expert_->heap = need;
  per_expert_->received.assign(S, 0);
  per_expert_->schedule = ubep::schedule(ctx.topology(), rank_, ctx.options().schedule);
  per_expert_->peers.resize(P);
  std::iota(per_expert_->peers.begin(), per_expert_->peers.end(), 0);
  for (int row = 0; row <= map_.max_local(); ++row) {
    per_expert_->writers.insert(per_expert_->writers.end(), per_expert_->peers.begin(), per_expert_->peers.end());
  }
  bool any_packed = false;
  for (int d = 0; d < size_; ++d) {
    any_packed = any_packed || packed(ctx.route(d));
    per_expert_->ucx = per_expert_->ucx || ctx.route(d) == Route::ucx;
  }
  // One call's regions to all network-route peers: a header each, and at most M x topk tokens in all.
  if (any_packed) per_expert_->stage_bytes = P * g.header + M * config.topk * token_bytes_;
  per_expert_->staging.resize(per_expert_->stage_bytes * (per_expert_->ucx ? S : 1));
}

OneSidedImpl::~OneSidedImpl() = default;
void OneSidedImpl::progress() {
  if (dedup_) {
    const auto lock = dedup_->enter();
    (void)dedup_->progress();
  } else {
    ctx_.progress();
  }
}
const std::vector<int>& OneSidedImpl::schedule() const noexcept {
  return dedup_ ? dedup_->schedule : per_expert_->schedule;
}
std::size_t OneSidedImpl::buffer_bytes() const {
  return dedup_ ? dedup_->buffer_bytes() : per_expert_->heap + per_expert_->staging.size();
}

void OneSidedImpl::send(HandleState& h, std::span<const std::byte> tokens, std::span<const float> scales) {
  if (dedup_) {
    const auto lock = dedup_->enter();
    return dedup_->send(h, tokens, scales);
  }
  PerExpert& m = *per_expert_;
  const std::size_t S = ctx_.options().run_ahead, L = map_.max_local(), P = size_;
  std::vector<std::uint64_t> header(2 * L);
  std::size_t staged = 0;
  // Back-pressure: d must have consumed call c - S from us before we overwrite that buffer set (its region on
  // d, our tbuf set). Owners on load/store first, all of them: they gather from our tbuf set, staged once.
  const auto wait_released = [&](int d) {
    if (h.call < S) return;
    const int w[] = {d};
    ctx_.wait_until(&m.rel[d], Cmp::ge, h.call - S + 1, {.writers = w, .what = "moe back-pressure (run-ahead)"});
  };
  bool gathered = false;
  for (int d : m.schedule) {
    if (map_.count(d) == 0 || packed(ctx_.route(d))) continue;
    wait_released(d);
    gathered = true;
  }
  if (gathered) stage_tokens(h, m.tbuf.data(), tokens, scales);
  for (int d : m.schedule) {
    const int local_d = map_.count(d);
    if (local_d == 0) continue;  // d owns no expert: nothing to write, nothing to signal
    wait_released(d);
    std::size_t rows = 0;
    for (int le = 0; le < local_d; ++le) {
      const std::size_t b = static_cast<std::size_t>(d) * L + le;
      header[2 * le] = static_cast<std::uint64_t>(h.send_counts[b]);
      header[2 * le + 1] = h.coffset[b];
      rows += h.batch_tokens[b].size();
    }
    count(true, d, rows * payload_bytes());
    std::byte* region = m.dbuf.data() + (static_cast<std::size_t>(h.set) * P + rank_) * m.region;
    // dsig entry (set, row, rank_) on d, ordered after every earlier put of ours to d.
    const auto signal = [&](std::size_t row, std::size_t count) {
      notify(ctx_, &m.dsig[(h.set * (L + 1) + row) * P + rank_], tag(h.call) | count, d);
    };
    const std::size_t header_bytes = 2 * static_cast<std::size_t>(local_d) * sizeof(std::uint64_t);
    if (std::byte* mapped = ctx_.ptr(region, m.region, d)) {
      // Load/store (d's region is mapped here, one range check for all of it): the header, then each
      // expert's token rows in our tbuf set, and each expert signalled as soon as its rows are in (the
      // release store of the signal publishes them and the staged tokens). d gathers the batch itself.
      std::memcpy(mapped, header.data(), header_bytes);
      auto* list = reinterpret_cast<std::uint32_t*>(mapped + m.header);
      for (int le = 0; le < local_d; ++le) {
        const std::vector<int>& toks = h.batch_tokens[static_cast<std::size_t>(d) * L + le];
        list = std::copy(toks.begin(), toks.end(), list);
        signal(le, toks.size());
      }
    } else {
      // mpi, ucx: pack header and tokens into the staging copy of the region, then one put.
      const bool ucx = ctx_.route(d) == Route::ucx;
      if (ucx) ctx_.flush_local(d);  // this set's copy, sent S calls ago: d has consumed it, UCX is done
      std::byte* st = m.staging.data() + (ucx ? h.set * m.stage_bytes : 0) + staged;
      std::memcpy(st, header.data(), header_bytes);
      std::byte* row = st + m.header;
      for (int le = 0; le < local_d; ++le) {
        const std::vector<int>& toks = h.batch_tokens[static_cast<std::size_t>(d) * L + le];
        pack(toks, row, tokens, scales);
        row += toks.size() * token_bytes_;
      }
      const std::size_t bytes = m.header + rows * token_bytes_;
      if (ucx) {
        // One message (am) or put + signal (rdma), in flight on return: the transfers to every peer
        // overlap, and the rendezvous of large regions proceed while this rank packs the next.
        ctx_.put_signal_nbi(region, st, bytes, &m.dsig[(h.set * (L + 1) + L) * P + rank_], tag(h.call) | rows,
                            SignalOp::set, d);
      } else {
        ctx_.put_nbi(region, st, bytes, d);
        signal(L, rows);
      }
      staged += bytes;
    }
  }
  // On the mpi route: one flush per peer (which also frees the staging), then every signal.
  ctx_.progress();
}

std::optional<int> OneSidedImpl::next_expert(Handle& h) {
  check_handle(h, "next_expert");
  HandleState& s = state_of(h);
  if (dedup_) {
    const auto lock = dedup_->enter();
    return dedup_->next_expert(s);
  }
  PerExpert& m = *per_expert_;
  const int local = local_experts();
  release_if_done(s);  // a rank without experts releases at once
  if (s.num_returned == local) return std::nullopt;
  const std::size_t L = map_.max_local(), P = size_;
  const std::span<const std::uint64_t> sigs(&m.dsig[s.set * (L + 1) * P], (L + 1) * P);
  // The dsig row that covers expert le from src: its own row over load/store, the region row over mpi and ucx.
  const auto row = [&](std::size_t le, std::size_t src) { return packed(ctx_.route(static_cast<int>(src))) ? L : le; };
  // Targets: tag(call) while awaited, kSignalIgnored (left out of the wait) when not awaited or already seen.
  if (s.want.empty()) {
    s.want.assign((L + 1) * P, kSignalIgnored);
    for (std::size_t src = 0; src < P; ++src) {
      for (int le = 0; le < local; ++le) s.want[row(le, src) * P + src] = tag(s.call);
    }
  }
  const auto region = [&](std::size_t src) { return m.dbuf.data() + (s.set * P + src) * m.region; };
  // A load/store source's batches are gathered from its staged tokens (tbuf), by the rows listed in its region.
  const std::size_t M = static_cast<std::size_t>(config_.max_tokens_per_rank);
  const auto gathered = [&](std::size_t src) { return !packed(ctx_.route(static_cast<int>(src))); };
  const auto rows_of = [&](std::size_t src) { return reinterpret_cast<const std::uint32_t*>(region(src) + m.header); };
  const std::size_t capacity = (m.region - m.header) / token_bytes_;
  const std::size_t Mk = static_cast<std::size_t>(config_.max_tokens_per_rank) * config_.topk;  // rows per set
  for (;;) {
    for (int le = 0; le < local; ++le) {
      if (!s.ready[le] || s.returned[le]) continue;
      s.returned[le] = 1;
      ++s.num_returned;
      return le;
    }
    // Regroup the first expert whose signals have all been seen, and hand it out at once: its tokens from
    // each source's region, where they follow the source's earlier experts. One at a time, so that the
    // copy of the next expert overlaps the caller's work on this one and the data is hot when it runs
    // (regrouping all ready experts first made the layer 7 % slower on one node).
    bool regrouped = false;
    for (int le = 0; le < local; ++le) {
      if (s.ready[le]) continue;
      bool complete = true;
      for (std::size_t src = 0; src < P && complete; ++src) complete = s.want[row(le, src) * P + src] == kSignalIgnored;
      if (!complete) continue;
      std::vector<std::size_t> first(P, 0);
      for (std::size_t src = 0; src < P; ++src) {
        const auto* header = reinterpret_cast<const std::uint64_t*>(region(src));
        // The source's header is input: its counts must fit this rank's region, its offsets the source's rows.
        if (const std::string why = wire::check_region_header(header, le, capacity, Mk); !why.empty()) {
          throw Error(Errc::protocol, "ubep: rank " + std::to_string(rank_) + ": next_expert: the region of rank " +
                                          std::to_string(src) + " in call " + std::to_string(s.call) +
                                          " breaks the protocol: " + why);
        }
        for (int e = 0; e < le; ++e) first[src] += header[2 * e];
        s.recv_counts[le * P + src] = static_cast<int>(header[2 * le]);
        s.recv_meta[le * P + src] = header[2 * le + 1];
        if (!gathered(src)) continue;
        // Its rows are input too: each must lie in its staged tokens.
        if (const std::string why = wire::check_gathered_rows(rows_of(src) + first[src], header[2 * le], M);
            !why.empty()) {
          throw Error(Errc::protocol, "ubep: rank " + std::to_string(rank_) + ": next_expert: the region of rank " +
                                          std::to_string(src) + " in call " + std::to_string(s.call) +
                                          " breaks the protocol: local expert " + std::to_string(le) + ": " + why);
        }
      }
      if (s.num_ready == 0) {
        // Outputs to network-route sources are staged in combine_send: size it now, while every such
        // source's header is here (its one signal covers all our experts) and its set not yet released.
        s.out_base.assign(P, 0);
        s.out_first.assign(P, 0);
        s.out_total.assign(P, 0);
        for (std::size_t src = 0; src < P; ++src) {
          if (!packed(ctx_.route(static_cast<int>(src)))) continue;
          const auto* header = reinterpret_cast<const std::uint64_t*>(region(src));
          s.out_base[src] = s.out_bytes;
          s.out_first[src] = header[1];
          for (int e = 0; e < local; ++e) s.out_total[src] += header[2 * e];
          s.out_bytes += s.out_total[src] * out_token_bytes_;
        }
      }
      const std::size_t stage = M * token_bytes_;
      regroup(
          s, le,
          [&](int src) -> const std::byte* {
            if (!gathered(src)) return region(src) + m.header + first[src] * token_bytes_;
            const std::byte* staged = ctx_.ptr(m.tbuf.data() + s.set * stage, stage, src);
            if (!staged) {
              throw Error(Errc::internal, "ubep: rank " + std::to_string(rank_) +
                                              ": next_expert: the staged tokens of rank " + std::to_string(src) +
                                              " are not mapped on a load/store route");
            }
            return staged;
          },
          [&](int src) { return gathered(src) ? rows_of(src) + first[src] : nullptr; });
      regrouped = true;
      break;
    }
    if (regrouped) {
      release_if_done(s);
      continue;
    }
    const std::string what = "moe dispatch of call " + std::to_string(s.call);
    for (std::size_t i : ctx_.wait_until_some(sigs, Cmp::ge, s.want, {.writers = m.writers, .what = what.c_str()})) {
      s.want[i] = kSignalIgnored;
    }
  }
}

void OneSidedImpl::release_if_done(HandleState& s) {
  if (s.released || s.num_ready != local_experts()) return;
  s.released = true;
  if (local_experts() == 0) return;  // no source writes to an owner without experts, nor waits for it
  // Everything of this call is copied out of our buffers. rel = c + 1 tells a source that every call up
  // to c is released (it then writes call c + S into set c % S), so releases go out in call order: a call
  // received before an older one is marked here and released with it. At most S calls are in flight, one
  // per set, so the mark of the set of call `released` is that call's.
  PerExpert& m = *per_expert_;
  const std::size_t S = ctx_.options().run_ahead;
  m.received[s.set] = 1;
  const std::uint64_t was = m.released;
  while (m.released < calls_ && m.received[m.released % S]) m.received[m.released++ % S] = 0;
  if (m.released == was) return;
  for (int src = 0; src < size_; ++src) notify(ctx_, &m.rel[rank_], m.released, src);
  ctx_.progress();
}

void OneSidedImpl::dispatch_recv(Handle& h) {
  check_handle(h, "dispatch_recv");
  HandleState& s = state_of(h);
  if (dedup_) {
    const auto lock = dedup_->enter();
    return dedup_->dispatch_recv(s);
  }
  // Complete every expert; hand-out state is restored so that next_expert still returns each once.
  std::vector<std::uint8_t> returned = s.returned;
  const int was = s.num_returned;
  while (next_expert(h)) {
  }
  s.returned = std::move(returned);
  s.num_returned = was;
}

std::span<std::byte> OneSidedImpl::heap_outputs(HandleState& s, int local, std::size_t bytes) {
  PerExpert& m = *per_expert_;
  if (dedup_ || m.orows == 0) return {};
  const std::size_t rows = bytes / out_token_bytes_;
  if (rows > m.orows - s.out_cursor) {
    // The batches fit the regions they came from, so their outputs fit orows.
    throw Error(Errc::internal, "ubep: rank " + std::to_string(rank_) + ": expert_outputs: " + std::to_string(rows) +
                                    " rows beyond the " + std::to_string(m.orows - s.out_cursor) + " left");
  }
  std::byte* first = m.obuf.data() + (static_cast<std::size_t>(s.set) * m.orows + s.out_cursor) * out_token_bytes_;
  s.out_cursor += rows;
  return {first, bytes};
}

void OneSidedImpl::send_outputs(Handle& h, int local, std::span<const std::byte> outputs) {
  check_combine_send(h, local, outputs);
  HandleState& s = state_of(h);
  if (dedup_) {
    const auto lock = dedup_->enter();
    return dedup_->combine_send(s, local, outputs);
  }
  PerExpert& m = *per_expert_;
  const std::size_t P = size_, L = map_.max_local();
  const std::size_t Mk = static_cast<std::size_t>(config_.max_tokens_per_rank) * config_.topk;
  const int experts = local_experts();
  // The outputs are this expert's heap rows (expert_outputs under Config::zero_copy): load/store sources read
  // them in place, mpi-route ones get them by a put straight from them.
  const bool in_place = m.orows && s.out_taken[local] && outputs.data() == s.out_rows[local].data();
  // Its first row among this call's set of heap rows (meaningful when in_place).
  const std::size_t row0 =
      in_place ? static_cast<std::size_t>(outputs.data() - m.obuf.data()) / out_token_bytes_ - s.set * m.orows : 0;
  if (s.out_bytes && s.out_stage.empty()) {
    // Staging for this call's outputs to network-route sources: on mpi freed by the flush after the last
    // expert; on ucx in flight after it, so a staging copy from the pool is reused only once UCX is done
    // with its sends (long done: their sources consumed them before they dispatched this call).
    if (!m.out_pool.empty()) {
      s.out_stage.swap(m.out_pool.back());
      m.out_pool.pop_back();
      if (m.ucx) {
        for (int src = 0; src < size_; ++src) {
          if (ctx_.route(src) == Route::ucx) ctx_.flush_local(src);
        }
      }
    }
    s.out_stage.resize(s.out_bytes);
    s.out_staged = 0;
  }
  // Rows of `outputs` are in source order (regroup order); send each source its block.
  std::vector<std::size_t> first(P + 1, 0);
  for (std::size_t src = 0; src < P; ++src) first[src + 1] = first[src] + s.recv_counts[local * P + src];
  for (int src : m.schedule) {
    const std::size_t c = static_cast<std::size_t>(s.recv_counts[local * P + src]);
    if (c == 0) continue;
    std::byte* dest = m.cbuf.data() + (s.set * Mk + s.recv_meta[local * P + src]) * out_token_bytes_;
    const std::byte* rows = outputs.data() + first[src] * out_token_bytes_;
    count(false, src, c * out_token_bytes_);
    if (!packed(ctx_.route(src))) {
      if (in_place) {
        m.otab[(static_cast<std::size_t>(s.set) * P + src) * L + local] = row0 + first[src];
      } else {
        ctx_.put(dest, rows, c * out_token_bytes_, src);
        if (m.orows) m.otab[(static_cast<std::size_t>(s.set) * P + src) * L + local] = kCopied;
      }
    } else if (in_place && ctx_.route(src) == Route::mpi) {
      ctx_.put_nbi(dest, rows, c * out_token_bytes_, src);  // the rows stay until the flush after the last expert
    } else if (ctx_.route(src) == Route::ucx) {
      // Into src's block, at this expert's place; the block goes after the last expert (below).
      const std::size_t at = s.out_base[src] + (s.recv_meta[local * P + src] - s.out_first[src]) * out_token_bytes_;
      if (s.recv_meta[local * P + src] < s.out_first[src] ||
          at + c * out_token_bytes_ > s.out_base[src] + s.out_total[src] * out_token_bytes_) {
        throw Error(Errc::internal, "ubep: rank " + std::to_string(rank_) + ": combine_send: outputs for rank " +
                                        std::to_string(src) + " fall outside its block sized from its header");
      }
      std::memcpy(s.out_stage.data() + at, rows, c * out_token_bytes_);
    } else {
      if (s.out_staged + c * out_token_bytes_ > s.out_stage.size()) {
        throw Error(Errc::internal, "ubep: rank " + std::to_string(rank_) + ": combine_send: outputs for rank " +
                                        std::to_string(src) + " exceed the staging sized from its header");
      }
      std::byte* st = s.out_stage.data() + s.out_staged;
      std::memcpy(st, rows, c * out_token_bytes_);
      ctx_.put_nbi(dest, st, c * out_token_bytes_, src);
      s.out_staged += c * out_token_bytes_;
    }
  }
  s.combined[local] = 1;
  if (++s.num_combined < experts) return;
  // The last local expert. The signal of a source that already went with its outputs (ucx):
  std::vector<std::uint8_t> signalled(P, 0);
  std::uint64_t* const csig = &m.csig[static_cast<std::size_t>(s.set) * P + rank_];
  if (m.ucx) {
    // One message per ucx-route source: all our experts' outputs and its signal (latency-bound calls
    // pay one message instead of one per expert; large ones lose only the overlap with the last expert).
    for (int src : m.schedule) {
      if (ctx_.route(src) != Route::ucx || s.out_total.empty() || s.out_total[src] == 0) continue;
      std::byte* dest = m.cbuf.data() + (s.set * Mk + s.out_first[src]) * out_token_bytes_;
      ctx_.put_signal_nbi(dest, s.out_stage.data() + s.out_base[src], s.out_total[src] * out_token_bytes_, csig,
                          tag(s.call) | 1, SignalOp::set, src);
      signalled[src] = 1;
    }
  }
  // One signal to every other source that sent us tokens, ordered after all outputs.
  for (int src : m.schedule) {
    int c = 0;
    for (int le = 0; le < experts; ++le) c += s.recv_counts[le * P + src];
    if (c && !signalled[src]) notify(ctx_, csig, tag(s.call) | 1, src);
  }
  // On the mpi route: one flush per peer with outputs in flight, then the signals; the staging is free
  // (on ucx its sends may still be in flight: see the reuse above).
  ctx_.progress();
  if (!s.out_stage.empty()) m.out_pool.push_back(std::move(s.out_stage));
}

void OneSidedImpl::recv_outputs(Handle& h, std::span<float> out) {
  // In dispatch order: a source may dispatch call c + S into set c % S as soon as fewer than S of its calls
  // are in flight, so a later call completed first would let call c + S overwrite call c's outputs.
  check_combine_recv(h);
  HandleState& s = state_of(h);
  if (dedup_) {
    const auto lock = dedup_->enter();
    dedup_->combine_recv(s, out);
    finish(s);
    return;
  }
  PerExpert& m = *per_expert_;
  const std::size_t P = size_, L = map_.max_local();
  // Owner d signals us once it has sent the outputs of all its experts, if we sent it any token.
  std::vector<std::uint64_t> want(P, 0);
  for (std::size_t d = 0; d < P; ++d) {
    for (std::size_t le = 0; le < L; ++le) {
      if (s.send_counts[d * L + le]) want[d] = tag(s.call);
    }
  }
  const std::string what = "moe combine, call " + std::to_string(s.call);
  ctx_.wait_until_all({&m.csig[static_cast<std::size_t>(s.set) * P], P}, Cmp::ge, want,
                      {.writers = m.peers, .what = what.c_str()});
  const std::byte* cbuf =
      m.cbuf.data() + s.set * static_cast<std::size_t>(config_.max_tokens_per_rank) * config_.topk * out_token_bytes_;
  std::vector<const std::byte*> batches = batches_at(s.coffset, cbuf, out_token_bytes_);
  if (m.orows) {
    // Config::zero_copy: an owner on load/store says per expert where our rows are, in its rows (read in place)
    // or in our cbuf. Its table is input: a row range outside its rows is a protocol error.
    const std::size_t set_bytes = m.orows * out_token_bytes_;
    for (std::size_t d = 0; d < P; ++d) {
      if (want[d] == 0 || packed(ctx_.route(static_cast<int>(d)))) continue;
      const std::uint64_t* tab =
          ctx_.ptr(&m.otab[(static_cast<std::size_t>(s.set) * P + rank_) * L], L, static_cast<int>(d));
      const std::byte* rows = ctx_.ptr(m.obuf.data() + s.set * set_bytes, set_bytes, static_cast<int>(d));
      for (std::size_t le = 0; le < L; ++le) {
        const std::uint64_t count = static_cast<std::uint64_t>(s.send_counts[d * L + le]);
        if (count == 0) continue;
        const std::uint64_t at = tab[le];
        if (at == kCopied) continue;
        if (at > m.orows || count > m.orows - at) {
          throw Error(Errc::protocol, "ubep: rank " + std::to_string(rank_) + ": combine_recv: call " +
                                          std::to_string(s.call) + ": rank " + std::to_string(d) +
                                          " breaks the protocol: its local expert " + std::to_string(le) + "'s " +
                                          std::to_string(count) + " output rows for us start at row " +
                                          std::to_string(at) + " of its " + std::to_string(m.orows));
        }
        batches[d * L + le] = rows + at * out_token_bytes_;
      }
    }
  }
  reduce_batches(s, batches, out);
  if (m.ucx) {
    // Our sends of this call (regions, outputs) are non-blocking and a rendezvous moves only while this
    // rank progresses: return only when UCX is done with them, so that a rank that goes on to compute or
    // to a plain MPI call never holds back a peer's combine_recv (their sources have them or wait for them).
    for (int p = 0; p < size_; ++p) {
      if (ctx_.route(p) == Route::ucx) ctx_.flush_local(p);
    }
  }
  finish(s);
}

}  // namespace ubep::moe
